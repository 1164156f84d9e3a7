"""The GEMM's rows grouped by kernel and measured: on the emulator (the truth the probe
must recover) and on real TensorFlow (whose last rows beyond a block of 4 take another
micro kernel)."""

import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.emulation import parse_model
from convprobe.probes import column_patterns, row_patterns
from convprobe.probes.column_patterns import ColumnRun
from convprobe.probes.layers import Layer
from conftest import run_cli_json

LANES2 = "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16)"
ROUNDED = "sequential:fp16:product=fp16"


def _measured(spec: str, layer: Layer, op: str):
    backend = EmulatedBackend(spec)
    columns, note = column_patterns.measure_columns(backend, layer, op)
    assert note == "", note
    reference = row_patterns.reference_row(layer, op, bool(columns))
    runs, note = row_patterns.measure_row_runs(backend, layer, op, reference, columns)
    reference_spec = (column_patterns.column_models(layer, op, columns)
                      or column_patterns.column_spec(columns[0].structure, layer.k(op)))
    return runs, note, reference_spec


@pytest.mark.parametrize("op,layer,spec", [
    # 49 output pixels: the 49th on a kernel of its own (TensorFlow's 1x7x7x16 * 3x3x16x8)
    ("conv2d", Layer((1, 7, 7, 16), (3, 3, 16, 8)), f"rows({LANES2} * 48, {ROUNDED})"),
    # 27 taps, each class of rows with two runs of columns of its own
    ("conv2d_backprop_filter", Layer((2, 4, 4, 3), (3, 3, 3, 8)),
     f"rows(columns({ROUNDED} * 4, {LANES2}) * 24, columns({ROUNDED} * 4, sequential:fp16))"),
    # a class in the middle: rows 5-9 differ, the rest are the reference's
    ("conv2d", Layer((1, 6, 6, 2), (3, 3, 2, 8), padding="VALID"), f"rows({ROUNDED} * 5, {LANES2} * 5, {ROUNDED})"),
])
def test_the_rows_are_grouped_and_each_class_measured(op, layer, spec):
    """The runs of rows and their columns give back the model, spec for spec."""
    runs, note, reference_spec = _measured(spec, layer, op)
    assert note == "" and len(runs) >= 2, runs
    assert runs[0].columns is None  # the reference row's class keeps the layer's measured structure
    assert row_patterns.row_models(layer, op, runs, reference_spec) == parse_model(spec).to_spec()


def test_one_kernel_for_every_row_gives_no_runs_and_no_spec():
    for op in row_patterns.ROW_OPS:
        runs, note, _ = _measured(LANES2, Layer((1, 7, 7, 16), (3, 3, 16, 8)), op)
        assert runs == [] and note == ""
        assert row_patterns.row_models(Layer((1, 7, 7, 16), (3, 3, 16, 8)), op, runs, LANES2) is None


def test_rows_that_are_not_measured_say_why():
    backend = EmulatedBackend(f"rows({LANES2} * 48, {ROUNDED})")
    layer = Layer((1, 7, 7, 16), (3, 3, 16, 8))
    runs, note = row_patterns.measure_row_runs(backend, layer, "conv2d_backprop_input", 0, [])
    assert runs == [] and "added together by col2im" in note
    one_column = [ColumnRun(j, None) for j in range(8)]  # 8 runs of one column: about 8 * 1432 calls
    runs, note = row_patterns.measure_row_runs(backend, layer, "conv2d", 0, one_column)
    assert runs == [] and f"over {row_patterns.MAX_CALLS}: rows not measured" in note


def test_the_proxy_has_the_layers_gemm_with_every_window_inside():
    layer = Layer((2, 7, 9, 3), (3, 2, 3, 5), strides=(2, 3), padding="SAME")
    at = row_patterns.proxy(layer)
    assert at.padding == "VALID" and at.output_shape == layer.output_shape
    assert at.k("conv2d") == layer.k("conv2d") and at.k("conv2d_backprop_filter") == layer.k("conv2d_backprop_filter")
    assert row_patterns.proxy(at) == at


def test_identify_confirms_the_measured_rows():
    """identify on the emulator picks the spec measured row by row, and says so."""
    spec = f"rows({LANES2} * 48, {ROUNDED})"
    doc = run_cli_json("identify", "--configs", "none", "--model", spec, "--input-shape", "1,7,7,16",
                       "--filter-shape", "3,3,16,8")
    summary = doc["matches"][f"emulated/{spec}"]["conv2d"]["summary"]
    assert summary["best"] == parse_model(spec).to_spec() and summary["stops_matching_at"] is None
    assert "measured row by row: 2 runs of rows" in summary["explanation"]
    assert summary["table"][LANES2] < 1.0


@pytest.mark.tensorflow
def test_real_gemm_rows_beyond_a_block_of_four_are_measured():
    """onednn-off+fp16-acc: 49 output pixels (the forward) and 9 taps (the filter gradient):
    the last row takes another kernel; measured row by row, 100% at two seeds; the model of
    the other rows alone is not."""
    for shape, filters, op in (("1,7,7,16", "3,3,16,8", "conv2d"), ("2,16,16,1", "3,3,1,8", "conv2d_backprop_filter")):
        for seed in ("0", "1"):
            doc = run_cli_json("identify", "--configs", "onednn-off+fp16-acc", "--seed", seed,
                               "--input-shape", shape, "--filter-shape", filters)
            summary = doc["matches"]["tensorflow/cpu/onednn-off+fp16-acc"][op]["summary"]
            assert summary["stops_matching_at"] is None and summary["best"].startswith("rows("), summary
            assert [run["first"] for run in summary["structure"]["rows"]] == [0, 48 if op == "conv2d" else 8]
            assert "measured row by row" in summary["explanation"]
            assert summary["table"][LANES2] < 1.0
