"""The PyTorch backend: its conventions are TensorFlow's and the emulator's (integer data, exact
in fp32), each configuration runs in its own process with its switches, and identify names
its arithmetic at a layer on both input sets, through the same general method."""

import pytest

from convprobe.backends.configurations import TORCH_MATRIX, matrix_configs, resolve_configs
from convprobe.errors import InvalidArgument

from conftest import assert_conv_ops_match_exact, rows_by_label, run_cli, run_cli_json

pytest.importorskip("torch", reason="the torch extra is not installed (pip install -e '.[torch]')")

from convprobe.backends.pytorch import TorchBackend  # noqa: E402 - after the skip: it needs PyTorch

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("padding", ["VALID", "SAME", [(1, 1), (0, 2)]])
@pytest.mark.parametrize("strides,dilation", [(1, 1), (2, 1), (1, 2)])
def test_torch_ops_follow_the_emulators_conventions(padding, strides, dilation):
    """Asymmetric and strided SAME padding too (an explicit pad before an unpadded conv)."""
    assert_conv_ops_match_exact(TorchBackend("cpu"), padding, strides, dilation)


def test_torch_configurations_are_validated_and_carry_their_switches():
    configs = {c.label: c for c in resolve_configs(backend="torch", accumulate="all")}
    assert sorted(configs) == ["torch/cpu/default", "torch/cpu/fp16", "torch/cpu/fp32"]
    assert "no switch that asks for fp16 accumulation" in configs["torch/cpu/fp16"].note
    assert configs["torch/cpu/fp16"].warnings == (configs["torch/cpu/fp16"].note,)
    assert configs["torch/cpu/default"].warnings == ()  # (asks nothing)
    assert all(c.isolated for c in configs.values())
    rows = {c.name: c for c in matrix_configs("cpu", "all", "torch")}
    assert list(rows) == list(TORCH_MATRIX["cpu"])
    assert rows["mkldnn-off"].environment == "mkldnn=off" and rows["mkldnn-off"].to_dict()["options"] == {
        "mkldnn": "off"}
    with pytest.raises(InvalidArgument, match="configuration must be one of default, mkldnn-off"):
        matrix_configs("cpu", "jit", "torch")
    with pytest.raises(InvalidArgument, match="mkldnn must be one of on, off; received 'maybe'"):
        TorchBackend("cpu", mkldnn="maybe")
    with pytest.raises(InvalidArgument, match="torch switch must be one of mkldnn, compile"):
        TorchBackend("cpu", tf16="on")


def test_the_65519_test_on_torch_says_a_request_no_switch_grants_was_not_honoured():
    """PyTorch on the CPU holds the fp16 products wide (0) whatever is asked: the fp16 request,
    which no PyTorch switch expresses, reads 'not honoured'; each row ran in its own process."""
    doc = run_cli_json("overflow", "--backend", "torch", "--accumulate", "all")
    rows = rows_by_label(doc)
    assert {label: row["observed"]["output"] for label, row in rows.items()} == {
        "torch/cpu/fp16": ["0.0"] * 3, "torch/cpu/fp32": ["0.0"] * 3, "torch/cpu/default": ["0.0"] * 3}
    assert rows["torch/cpu/fp16"]["honoured"] is False and rows["torch/cpu/fp32"]["honoured"] is True
    assert rows["torch/cpu/default"]["runtime"]["torch_version"].startswith("2.")


@pytest.mark.slow
def test_a_switch_is_set_in_its_own_process_only():
    doc = run_cli_json("overflow", "--backend", "torch", "--accumulate", "default")
    (row,) = doc["results"]
    assert row["runtime"]["mkldnn_enabled"] is True  # the default row: nothing set
    off = run_cli_json("fingerprint", "--backend", "torch", "--configs", "mkldnn-off", "--op", "matmul")
    (result,) = off["results"]
    assert result["runtime"]["mkldnn_enabled"] is False and result["runtime"]["switches"] == {"mkldnn": "off"}


@pytest.mark.slow
def test_identify_names_torchs_arithmetic_at_a_layer_on_both_input_sets(tmp_path):
    """PyTorch's CPU convs, with oneDNN on and off: every op at 100% on the U[0, 1) and the
    signed confirmation inputs (through a measured spec or the recovered summation trees), at
    issue 44's layer: without oneDNN its filter gradient sums each sample's 144 products in
    fp32 (a 128-product vector tree and a 16-product tail), stores that to fp16, and adds the
    next sample's sum in fp32 before storing again - a double rounding 1 output in 8,192
    showed before the step that adds a partial sum was measured."""
    doc = run_cli_json("identify", "--backend", "torch", "--configs", "default,mkldnn-off", "--input-shape",
                       "2,12,12,40", "--filter-shape", "3,3,40,24", "--output", str(tmp_path / "torch.json"))
    for label, per_op in doc["matches"].items():
        assert label.startswith("torch/cpu/")
        for op, entry in per_op.items():
            summary = entry["summary"]
            assert summary["stops_matching_at"] is None, (label, op, summary["explanation"])
            assert summary["confirmation"]["fractions"][summary["best"]] == 1.0, (label, op, summary["best"])


@pytest.mark.slow
def test_sweep_measures_torchs_error_per_configuration_in_its_own_process():
    """`sweep --backend torch`: every row is PyTorch's, each configuration ran in its own process
    with its switch, and the errors are those of a wide accumulator (fp32 on the CPU, with
    oneDNN on and off): at K = 576 every output is within one fp16 ulp of the exact sum, where
    an fp16 accumulator of U[0, 1) products would be off by several."""
    doc = run_cli_json("sweep", "--backend", "torch", "--configs", "default,mkldnn-off", "--ks", "9,576",
                       "--distributions", "uniform01,uniform11", "--rows", "8")
    assert [r["config"]["label"] for r in doc["results"]] == ["torch/cpu/default", "torch/cpu/mkldnn-off"]
    assert [r["runtime"]["mkldnn_enabled"] for r in doc["results"]] == [True, False]
    rows = doc["table"]["rows"]
    assert len(rows) == 8 and {row["backend"] for row in rows} == {"torch"}
    assert all(row["status"] == "ok" and row["max_ulp_distance"] <= 1 for row in rows), rows


def test_study_commands_list_torchs_matrix():
    proc = run_cli("identify", "--backend", "torch", "--list-configs")
    assert proc.returncode == 0, proc.stderr
    assert "mkldnn-off" in proc.stdout and "compile=inductor" in proc.stdout


@pytest.mark.slow
def test_a_study_command_runs_several_frameworks_matrices():
    """`--backend torch,jax`: each framework's default rows, each in its own process, and a
    --configs name taken from whichever framework has it."""
    pytest.importorskip("jax", reason="the jax extra is not installed")
    doc = run_cli_json("fingerprint", "--backend", "torch,jax", "--op", "conv2d")
    assert [r["config"]["label"] for r in doc["results"]] == [
        "torch/cpu/default", "torch/cpu/mkldnn-off", "jax/cpu/default", "jax/cpu/f32-result", "jax/cpu/strict",
        "jax/cpu/strict+f32-result"]
    assert all(r["status"] == "ok" for r in doc["results"])
    proc = run_cli("fingerprint", "--backend", "torch,jax", "--configs", "mkldnn-off,jit+strict")
    assert proc.returncode == 2 and "received 'jit+strict'" in proc.stderr


def test_threads_is_refused_for_a_framework_that_does_not_read_it():
    proc = run_cli("identify", "--backend", "torch", "--threads", "2", "--input-shape", "1,4,4,8",
                   "--filter-shape", "3,3,8,4")
    assert proc.returncode == 2 and "threads applies to TensorFlow's configurations only" in proc.stderr
