"""The 65519 test: classification, and real TensorFlow end to end."""

import csv
import io
import json
import math

import numpy as np
import pytest

from conftest import rows_by_label, run_cli
from convprobe.probes import overflow


def test_inputs_are_the_classic_question_s():
    x, w = overflow.inputs()
    assert x.shape == (1, 1, 4, 1) and w.shape == (1, 2, 1, 1)
    assert x.dtype == w.dtype == np.float16
    assert x.ravel().tolist() == [65504.0] * 4 and w.ravel().tolist() == [65504.0, -65504.0]


@pytest.mark.parametrize("values,accumulation,arithmetic", [
    ([0.0, 0.0, 0.0], "fp32", overflow.WIDE),
    ([math.inf] * 3, "fp16", overflow.FP16_FUSED),
    ([-math.inf] * 3, "fp16", overflow.FP16_FUSED),
    ([math.nan] * 3, "fp16", overflow.FP16_SEPARATE),
    ([0.0, math.inf, 0.0], "unknown", overflow.UNEXPECTED),
    ([65504.0] * 3, "unknown", overflow.UNEXPECTED),
])
def test_three_way_classification(values, accumulation, arithmetic):
    assert overflow.classify(values)[:2] == (accumulation, arithmetic)


@pytest.mark.tensorflow
def test_tensorflow_on_cpu_fp16_gives_inf_and_fp32_default_give_zero(overflow_all):
    rows = rows_by_label(overflow_all)
    fp16, fp32, default = rows["tensorflow/cpu/fp16"], rows["tensorflow/cpu/fp32"], rows["tensorflow/cpu/default"]
    assert fp16["observed"]["output"] == ["inf"] * 3
    assert fp16["observed"]["output_bits"] == ["0x7c00"] * 3
    assert (fp16["accumulation"], fp16["honoured"]) == ("fp16", True)
    for row in (fp32, default):
        assert row["observed"]["output"] == ["0.0"] * 3
        assert row["accumulation"] == "fp32"
    assert fp32["honoured"] is True and default["honoured"] is None
    assert fp16["runtime"]["onednn_enabled"] is False and default["runtime"]["onednn_enabled"] is True


@pytest.mark.tensorflow
def test_emulated_fp16_gives_inf_like_tensorflow(overflow_all):
    rows = rows_by_label(overflow_all)
    assert rows["emulated/sequential:fp16"]["observed"]["output"] == ["inf"] * 3
    assert rows["emulated/sequential:fp32"]["observed"]["output"] == ["0.0"] * 3


@pytest.mark.tensorflow
def test_results_carry_provenance(overflow_all):
    from convprobe.results import SCHEMA_VERSION

    assert (overflow_all["schema_version"], overflow_all["kind"]) == (SCHEMA_VERSION, "overflow")
    for row in overflow_all["results"]:
        prov = row["provenance"]
        assert prov["schema_version"] == SCHEMA_VERSION and prov["seed"] == 0
        assert prov["versions"]["numpy"] == np.__version__
        assert "cpu_flags" in prov and "environment" in prov
    child = rows_by_label(overflow_all)["tensorflow/cpu/fp16"]
    assert child["provenance"]["environment"]["TF_CONV2D_USE_FP16_ACCUMULATE"] == "1"
    assert child["provenance"]["versions"]["tensorflow"] == child["runtime"]["tensorflow_version"]


@pytest.mark.tensorflow
def test_expect_fails_with_exit_1_when_the_observed_accumulation_differs():
    proc = run_cli("overflow", "--backend", "tensorflow", "--accumulate", "fp32", "--expect", "fp16")
    assert proc.returncode == 1
    assert "expectation failed: tensorflow/cpu/fp32 expected fp16 accumulation, observed fp32" in proc.stderr


@pytest.mark.tensorflow
def test_expect_holds_with_exit_0_and_csv_file_output(tmp_path):
    out = tmp_path / "overflow.csv"
    proc = run_cli("overflow", "--backend", "tensorflow", "--accumulate", "fp16", "--expect", "fp16",
                   "--format", "csv", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text == proc.stdout
    (row,) = list(csv.DictReader(io.StringIO(text)))
    assert (row["configuration"], row["output"], row["accumulation"]) == ("tensorflow/cpu/fp16", "[inf, inf, inf]", "fp16")
    assert json.loads(row["provenance"])["environment"]["TF_CONV2D_USE_FP16_ACCUMULATE"] == "1"


@pytest.mark.parametrize("model,output,accumulation,arithmetic,first_inf", [
    ("sequential:fp16", ["inf"] * 3, "fp16", overflow.FP16_FUSED, 1),
    ("sequential:fp16:product=fp16", ["nan"] * 3, "fp16", overflow.FP16_SEPARATE, None),
    ("sequential:fp32", ["0.0"] * 3, "fp32", overflow.WIDE, None),
    # both products fused in one block give 0; the spread test overflows from d = b on
    ("blocked:fp16:b=4", ["0.0"] * 3, "fp16", overflow.blocked_arithmetic(4), 4),
    ("v100:out=fp16", ["0.0"] * 3, "fp16", overflow.blocked_arithmetic(4), 4),
    ("h100:out=fp16", ["0.0"] * 3, "fp16", overflow.blocked_arithmetic(16), 16),
    ("a100", ["0.0"] * 3, "fp32", overflow.WIDE, None),
])
def test_all_three_outcomes_are_reachable_on_the_emulator_from_the_cli(model, output, accumulation, arithmetic,
                                                                        first_inf):
    proc = run_cli("overflow", "--backend", "emulated", "--model", model, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["results"]
    assert row["observed"]["output"] == output
    assert (row["accumulation"], row["arithmetic"]) == (accumulation, arithmetic)
    assert row["config"]["label"] == f"emulated/{model}"
    spread = row["observed"]["spread"]
    assert len(spread) == len(overflow.SPREADS)
    assert overflow.block_size(spread) == first_inf


@pytest.mark.parametrize("model,expect,code", [
    ("blocked:fp16:b=4", "fp32", 1), ("blocked:fp16:b=4", "fp16", 0),
    ("a100", "fp32", 0), ("a100", "fp16", 1), ("v100:out=fp16", "fp16", 0),
])
def test_expect_agrees_with_the_block_fma_report(model, expect, code):
    proc = run_cli("overflow", "--backend", "emulated", "--model", model, "--expect", expect)
    assert proc.returncode == code, proc.stderr


def test_a_bad_model_spec_is_one_line_and_exit_2():
    proc = run_cli("overflow", "--backend", "emulated", "--model", "blocked:fp16:b=0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "convprobe overflow: error: b must be an integer >= 1; received 0"


def test_a_probe_failing_inside_an_emulated_configuration_is_a_failed_row_without_a_traceback():
    """fp16 inputs through a bf16-input tensor core: the emulator refuses them. The row says so
    in one line; the traceback goes to the JSON record only."""
    proc = run_cli("overflow", "--backend", "emulated", "--model", "a100:in=bf16")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "emulated/a100:in=bf16: failed: InvalidArgument: x holds values that are not bf16 numbers" in proc.stdout
    proc = run_cli("overflow", "--backend", "emulated", "--model", "a100:in=bf16", "--format", "json")
    (row,) = json.loads(proc.stdout)["results"]
    assert row["status"] == "failed" and "\n" not in row["error"]
    assert row["error_detail"].startswith("Traceback") and "InvalidArgument" in row["error_detail"]
