"""The GEMM's tiles grouped by kernel and measured: on the emulator (the truth the probe
must recover) and on real TensorFlow (whose last rows beyond a block of 4 take another
micro kernel, and whose small images leave the window probe too few windows)."""

import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.emulation import parse_model
from convprobe.identify import column_patterns, tile_patterns
from convprobe.identify.column_patterns import ColumnRun
from convprobe.identify.structure import Structure
from convprobe.probes.layers import Layer
from conftest import run_cli_json

LANES2 = "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16)"
ROUNDED = "sequential:fp16:product=fp16"
#: Input gradient 3x3x3x16: 27 GEMM columns (tap, channel) in blocks of 16, 8 and 3, each dx
#: channel meeting its taps' columns in the rotated filter's order (as in test_layer_identify).
BY_TAP = (f"columns(splitk(length=16, {ROUNDED}, first=sequential:fp16 | {LANES2} | {LANES2}, combine=fp16), "
          f"splitk(length=16, {ROUNDED}, first=sequential:fp16 | {LANES2} | {LANES2} | {LANES2}, combine=fp16))")


def _measured(spec: str, layer: Layer, op: str, main_row: int | None = 0):
    tiling = tile_patterns.measure_tiles(EmulatedBackend(spec), layer, op, main_row)
    main_model = tiling.columns and (column_patterns.column_models(layer, op, tiling.columns)
                                     or column_patterns.column_model(tiling.columns[0].structure, layer.k(op)))
    return tiling, main_model  # (no columns: the layer's crafted rows measure the main class)


@pytest.mark.parametrize("op,layer,spec", [
    # 49 output pixels: the 49th on a kernel of its own (TensorFlow's 1x7x7x16 * 3x3x16x8)
    ("conv2d", Layer((1, 7, 7, 16), (3, 3, 16, 8)), f"rows({LANES2} * 48, {ROUNDED})"),
    # 27 taps, each class of rows with two runs of columns of its own
    ("conv2d_backprop_filter", Layer((2, 4, 4, 3), (3, 3, 3, 8)),
     f"rows(columns({ROUNDED} * 4, {LANES2}) * 24, columns({ROUNDED} * 4, sequential:fp16))"),
    # a class in the middle: rows 5-9 differ, the rest are the main class
    ("conv2d", Layer((1, 6, 6, 2), (3, 3, 2, 8), padding="VALID"), f"rows({ROUNDED} * 5, {LANES2} * 5, {ROUNDED})"),
])
def test_the_rows_are_grouped_and_each_class_measured(op, layer, spec):
    """The runs of rows and their columns give back the model, spec for spec."""
    tiling, main_model = _measured(spec, layer, op)
    assert tiling.rows_note == "" and len(tiling.rows) >= 2, tiling
    assert tiling.rows[0].columns is None  # row 0's class is the main one: the layer's measured structure
    assert tile_patterns.row_models(layer, op, tiling.rows, main_model).to_spec() == parse_model(spec).to_spec()


def test_the_main_class_is_the_row_the_crafted_rows_are_read_at():
    """Main row 48: its one window is too few for the window probe (the layer's own crafted rows
    measure it), and the 48 others are the class measured in the column layout."""
    spec, layer = f"rows({LANES2} * 48, {ROUNDED})", Layer((1, 7, 7, 16), (3, 3, 16, 8))
    tiling, _ = _measured(spec, layer, "conv2d", main_row=48)
    assert tiling.columns == [] and "one kernel for every column" in tiling.columns_note
    assert [run.first for run in tiling.rows] == [0, 48] and tiling.rows[1].columns is None
    assert tile_patterns.row_models(layer, "conv2d", tiling.rows, parse_model(ROUNDED)).to_spec() == \
        parse_model(spec).to_spec()


def test_columns_the_window_probe_cannot_afford_are_measured_in_the_column_layout():
    """One window fits a 3x3 image's proxy (forward: about 2728 calls at K = 576); one
    channel (filter gradient: 1432 calls): the columns are measured one pattern a column
    instead, and give back the model; the input gradient's (tap, channel) columns too."""
    by_column = f"columns({ROUNDED} * 16, {LANES2})"
    for op, layer in (("conv2d", Layer((1, 3, 3, 64), (3, 3, 64, 24))),
                      ("conv2d_backprop_filter", Layer((1, 12, 12, 1), (3, 3, 1, 24)))):
        assert column_patterns.measure_columns(EmulatedBackend(by_column), tile_patterns.proxy(layer), op)[0] == []
        tiling, _ = _measured(by_column, layer, op, None)
        assert tiling.columns_note == "" and [run.first for run in tiling.columns] == [0, 16], tiling.columns_note
        assert column_patterns.column_models(layer, op, tiling.columns).to_spec() == parse_model(by_column).to_spec()
    layer = Layer((1, 3, 3, 3), (3, 3, 3, 16))  # 27 columns (tap, channel): 16, 8 and 3 (test_layer_identify)
    tiling, _ = _measured(BY_TAP, layer, "conv2d_backprop_input", None)
    assert tiling.columns_note == "" and [run.first for run in tiling.columns] == [0, 16, 24], tiling.columns_note
    assert column_patterns.column_models(layer, "conv2d_backprop_input", tiling.columns).to_spec() == \
        parse_model(BY_TAP).to_spec()


def test_one_kernel_for_every_tile_gives_no_runs_of_rows():
    for op in ("conv2d", "conv2d_backprop_filter"):
        tiling, _ = _measured(LANES2, Layer((1, 7, 7, 16), (3, 3, 16, 8)), op)
        assert tiling.rows == [] and tiling.rows_note == "" and len(tiling.columns) == 1


#: TensorFlow's 1x6x6x18 * 2x2x18x21 VALID input gradient (as identify measured it): GEMM row 24,
#: the last dy position, rounds products in the block of 8 columns (64-71: tap 3, channels
#: 10-17) too; only dx pixel 35 reads it, through tap 3, so only its spec differs.
DX_ROWS = (f"rows(columns(splitk(length=21, {ROUNDED}, combine=fp16) * 10, splitk(length=21, {ROUNDED}, "
           f"first=lanes(2, {ROUNDED}, combine=sequential:fp16, tail=5), combine=fp16)) * 35, "
           f"splitk(length=21, {ROUNDED}, combine=fp16))")


def test_an_input_gradients_rows_are_dy_positions_mapped_to_dx_pixels():
    """The tiles of DX_ROWS's GEMM (rows: dy positions) are measured and give its dx pixels' spec back."""
    layer = Layer((1, 6, 6, 18), (2, 2, 18, 21), padding="VALID")
    tiling = tile_patterns.measure_tiles(EmulatedBackend(DX_ROWS), layer, "conv2d_backprop_input", None)
    assert [run.first for run in tiling.rows] == [0, 24] and [run.first for run in tiling.columns] == [0, 64]
    assert tile_patterns.dx_row_models(layer, tiling.rows, tiling.columns).to_spec() == parse_model(DX_ROWS).to_spec()
    same = [tile_patterns.RowRun(0), tile_patterns.RowRun(24, tuple(tiling.columns))]  # row 24 as the main rows
    assert tile_patterns.dx_row_models(layer, same, tiling.columns) is None


def test_a_class_with_an_unmeasured_run_of_columns_gives_no_spec():
    """Columns 4-7 of row 48's class have no structure: no spec, not run 0's for them all."""
    layer = Layer((1, 7, 7, 16), (3, 3, 16, 8))
    runs = [tile_patterns.RowRun(0), tile_patterns.RowRun(48, (
        ColumnRun(0, Structure("fp16", [], 1, True, total="fp16")), ColumnRun(4, Structure(note="not measured"))))]
    assert tile_patterns.row_models(layer, "conv2d", runs, parse_model("sequential:fp16")) is None
    runs[1] = tile_patterns.RowRun(48, (ColumnRun(0, Structure("fp16", [], 1, True, total="fp16")),))
    assert tile_patterns.row_models(layer, "conv2d", runs, parse_model("sequential:fp16")).to_spec() == \
        "rows(sequential:fp16 * 48, sequential:fp16:product=fp16)"


def test_tiles_that_are_not_measured_say_why():
    layer = Layer((1, 7, 7, 16), (3, 3, 16, 8))
    one_each = "columns(" + ", ".join(f"chunked:fp16:n={n}" for n in range(8, 16)) + ")"  # 8 kernels, 8 columns
    tiling, _ = _measured(f"rows({one_each} * 48, {ROUNDED})", layer, "conv2d")
    assert tiling.rows == [] and f"over {tile_patterns.MAX_CALLS}; rows not measured" in tiling.rows_note


def test_the_proxy_has_the_layers_gemm_with_every_window_inside():
    layer = Layer((2, 7, 9, 3), (3, 2, 3, 5), strides=(2, 3), padding="SAME")
    at = tile_patterns.proxy(layer)
    assert at.padding == "VALID" and at.output_shape == layer.output_shape
    assert at.k("conv2d") == layer.k("conv2d") and at.k("conv2d_backprop_filter") == layer.k("conv2d_backprop_filter")
    assert tile_patterns.proxy(at) == at


def test_identify_confirms_the_measured_rows():
    """identify on the emulator picks the spec measured row by row, and says so."""
    spec = f"rows({LANES2} * 48, {ROUNDED})"
    doc = run_cli_json("identify", "--configs", "none", "--model", spec, "--input-shape", "1,7,7,16",
                       "--filter-shape", "3,3,16,8")
    summary = doc["matches"][f"emulated/{spec}"]["conv2d"]["summary"]
    assert summary["best"] == parse_model(spec).to_spec() and summary["stops_matching_at"] is None
    assert "measured row by row: 2 runs of rows" in summary["explanation"]
    assert summary["table"][LANES2] < 1.0


def _real(shape: str, filters: str, *extra: str, seed: str = "0") -> dict:
    doc = run_cli_json("identify", "--configs", "onednn-off+fp16-acc", "--seed", seed, "--input-shape", shape,
                       "--filter-shape", filters, *extra)
    return doc["matches"]["tensorflow/cpu/onednn-off+fp16-acc"]


@pytest.mark.tensorflow
def test_real_gemm_rows_beyond_a_block_of_four_are_measured():
    """onednn-off+fp16-acc: 49 output pixels (forward), 9 taps (filter gradient) and 25 dy
    positions (input gradient): the last GEMM row takes another kernel; measured row by
    row, 100%; the model of the other rows alone is not."""
    cases = (("1,7,7,16", "3,3,16,8", (), "conv2d", 48), ("2,16,16,1", "3,3,1,8", (), "conv2d_backprop_filter", 8),
             ("1,6,6,18", "2,2,18,21", ("--padding", "VALID"), "conv2d_backprop_input", 24))
    for shape, filters, extra, op, last in cases:
        summary = _real(shape, filters, *extra)[op]["summary"]
        assert summary["stops_matching_at"] is None and summary["best"].startswith("rows("), summary
        assert [run["first"] for run in summary["structure"]["rows"]] == [0, last]
        assert "measured row by row" in summary["explanation"]
        assert max(f for spec, f in summary["table"].items() if not spec.startswith("rows(")) < 1.0


@pytest.mark.tensorflow
@pytest.mark.slow
def test_real_tiles_at_more_shapes_and_seeds():
    """Small images (the window probe too dear: columns in the column layout), row remainders
    of 1 to 3, strides, 5x5 and 1x1 filters: every op 100% at two seeds."""
    cases = (("1,4,4,128", "3,3,128,24", ()), ("1,15,15,2", "3,3,2,11", ()), ("1,11,11,4", "5,5,4,9", ()),
             ("1,5,5,8", "3,3,8,24", ()), ("2,5,5,3", "3,3,3,24", ()), ("1,3,3,64", "1,1,64,8", ()),
             ("1,9,9,32", "3,3,32,40", ("--strides", "2")), ("2,7,5,6", "3,3,6,30", ("--padding", "VALID")))
    for shape, filters, extra in cases:
        for seed in ("0", "1"):
            for op, result in _real(shape, filters, *extra, seed=seed).items():
                assert result["summary"]["stops_matching_at"] is None, (shape, filters, op, result["summary"])
