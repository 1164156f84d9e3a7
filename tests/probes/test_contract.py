"""The precision contract: the declared accumulation against the battery's observed one, per
configuration and op, each configuration in its own process where it is a framework's."""

import json

import pytest

from convprobe import results
from convprobe.backends.configurations import emulated_config
from convprobe.probes.contract import Verdict, contract_cells, contract_configs, contract_summary, run_contract
from convprobe.probes.result import ProbeResult

from conftest import run_cli


def test_a_declaration_the_op_does_not_keep_is_not_honoured():
    """The emulator as three configurations: fp16 declared and done, fp16 declared over an
    fp32 accumulator, and nothing declared. The battery's typed reading decides each."""
    configs = [emulated_config("sequential:fp16", "fp16"), emulated_config("sequential:fp32", "fp16"),
               emulated_config("pairwise:fp32")]
    outcome = run_contract(configs, ("conv2d", "matmul"), seed=0, device="cpu", timeout=300, jobs=1)
    cells = {(c["configuration"], c["op"]): c for c in outcome.document["cells"]}
    assert len(cells) == 6
    for op in ("conv2d", "matmul"):
        assert cells[("emulated/sequential:fp16", op)]["verdict"] == Verdict.HONOURED
        broken = cells[("emulated/sequential:fp32", op)]
        assert (broken["declared"], broken["observed"], broken["verdict"]) == ("fp16", "fp32", Verdict.NOT_HONOURED)
        assert "24 significand bits" in broken["evidence"]
        assert cells[("emulated/pairwise:fp32", op)]["verdict"] == Verdict.NOTHING_DECLARED
    assert outcome.summary == "2 of 4 declared (configuration, op) cells not honoured"
    assert [note.split(": declared")[0] for note in outcome.notes] == ["emulated/sequential:fp32 conv2d",
                                                                     "emulated/sequential:fp32 matmul"]
    results.validate(json.loads(json.dumps(outcome.document)), where="the contract document")


@pytest.mark.torch
def test_the_contract_command_shows_pytorchs_undeclarable_fp16_as_not_honoured(tmp_path):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    out = tmp_path / "contract.json"
    proc = run_cli("contract", "--backend", "torch", "--op", "conv2d", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "1 of 2 declared (configuration, op) cells not honoured" in proc.stdout
    document = results.read(out, kinds=("contract",))
    verdicts = {c["configuration"]: c["verdict"] for c in document["cells"]}
    assert verdicts == {"torch/cpu/fp16": "NOT HONOURED", "torch/cpu/fp32": "honoured",
                        "torch/cpu/default": "nothing declared"}
    assert all(r["probe"] == "fingerprint" for r in document["results"])
    figures = tmp_path / "figures"
    report = run_cli("report", str(out), "--output", str(figures))
    assert report.returncode == 0, report.stderr
    assert (figures / "contract-table.png").stat().st_size > 0


@pytest.mark.parametrize("args,message", [
    (["--backend", "mxnet"], "backend must be one of tensorflow, jax, torch, all; received 'mxnet'"),
    (["--op", "conv9d"], "op must be one of"),
    (["--output", "x.txt"], "--output"),
])
def test_bad_contract_requests_are_refused_before_any_work(args, message):
    proc = run_cli("contract", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_op_that_failed_in_a_process_that_ran_is_not_measured_with_its_own_reason():
    """The battery ran (status ok) but one op raised: that cell is 'not measured', its reason the
    op's own error, and it is counted apart from the declared cells that were measured."""
    config = emulated_config("sequential:fp16", "fp16")
    ran = run_contract([config], ("matmul",), seed=0, device="cpu", timeout=300, jobs=1).probe_results[0]
    observed = {"ops": {**ran.observed["ops"], "conv2d": {"status": "failed", "error": "ValueError: no kernel"}}}
    result = ProbeResult("fingerprint", config, "ok", observed=observed)
    cells = {c.op: c for c in contract_cells(result, ("matmul", "conv2d"))}
    assert cells["matmul"].verdict is Verdict.HONOURED
    assert (cells["conv2d"].verdict, cells["conv2d"].evidence) == (Verdict.NOT_MEASURED, "ValueError: no kernel")
    assert contract_summary(list(cells.values())) == ("0 of 1 declared (configuration, op) cells not honoured; "
                                                      "1 declared cells not measured")


def test_a_request_and_a_matrix_row_of_one_name_are_one_configuration():
    labels = [c.label for c in contract_configs(("tensorflow",), "cpu", "all")]
    assert len(labels) == len(set(labels)) and "tensorflow/cpu/default" in labels
    assert "tensorflow/cpu/jit+strict" in labels and "tensorflow/cpu/fp16" in labels
