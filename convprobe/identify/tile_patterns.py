"""The GEMM's output tiles: which rows and columns share a micro kernel, and what each computes.

A GEMM kernel picks its micro kernel by output tile, (row block, column block). On
oneDNN-off fp16 accumulation the column blocks of 16, 8 and the rest differ
(`column_patterns`), and so do the rows past the last whole block of 4: at
1,7,7,16 * 3,3,16,8 (49 output pixels) conv2d rows 0-47 sum in two lanes and row 48
adds rounded products in one chain (docs/identify.md, "Tiles").

The *column layout* here is `column_patterns`' row layout turned around: the operand
that indexes the GEMM's columns carries the patterns and the other is a constant, so
every row sums the same patterns:
- forward: filter column o over the taps (i, j, c), x constant; every output pixel read;
- filter gradient: dy channel o over the positions (n, oh, ow), x constant; every tap read;
- input gradient: the filter's (i, j, c, :) over C_out for column (tap, c), dy a constant
  at the isolated positions of `column_patterns` (GEMM row p, column (t, c) lands alone
  on the dx pixel tap t of p reads); those rows read.

A row reads the whole pattern only where its window lies inside the image, so all of
it runs on the layer's *proxy*: the same GEMM (N, OH, OW, filter, strides, dilation)
with VALID padding and an input just large enough. `identify` confirms every spec at
the user's own layer.

`measure_tiles`:
1. `tile_classes`: `SIGNATURE_CALLS` calls of one seeded random pattern in every column,
   x a constant that rounds products, group the rows read by their outputs over all
   columns and the columns by theirs over all rows.
2. The *main* class of rows (the one the layer's own crafted rows are read at) has its
   columns measured by `column_patterns.measure_columns` (kept to that class's rows) where
   that takes at most its `MAX_CALLS`, else run of columns by run in the column layout
   (one pattern a column a call).
3. Each other class of rows has each run of columns measured in the column layout at
   its first row (`rows(...)` in the emulator). The input gradient's rows are dy
   positions that col2im adds into dx: each dx pixel's tap takes the kernel of the dy
   position it reads (`_dx_pixel_runs`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from convprobe.emulation import AccumulationModel
from convprobe.emulation.composites import Rows
from convprobe.errors import InvalidArgument
from convprobe.identify.column_patterns import (MAX_CALLS as WINDOW_CALLS, ColumnRun, column_calls, column_capacity,
                                              column_count, column_k, column_model, measure_columns,
                                              model_by_column, window_row, window_sets)
from convprobe.probes.layers import Layer, run_ops
from convprobe.identify.structure import Structure, blocks, measure_rows

__all__ = ["RowRun", "Tiles", "Tiling", "SIGNATURE_CALLS", "MAX_CALLS", "proxy", "rows_read",
           "column_layout_outputs", "tile_classes", "measure_tiles", "row_models",
           "dx_row_models"]

#: Calls of random patterns that group the rows and columns.
SIGNATURE_CALLS = 16
#: Most op calls the column layout's measurements of one op may make (about 3 K + 1000
#: patterns a class and run of columns, one pattern a column a call; a call took 0.14-1.0 ms
#: on TensorFlow, 2-core Zen 4, `python scripts/tile_call_cost.py`)...
MAX_CALLS = 8192
#: ... and most multiply-adds in all (calls x the GEMM's M N K): 2**33, about 3 s at the
#: 2.8 GMAC/s of the largest layer measured there.
MAX_WORK = 2**33
#: The constant operand of the random calls: 1 + 2**-10, so a product rounded to fp16 shows.
_ROUNDING_CONSTANT = 1.0 + 2.0**-10


@dataclass(frozen=True)
class RowRun:
    """GEMM rows `first` up to the next run's first (or the last row) share a kernel: the
    main class's (`columns` None: the layer's own measured structure) or these runs of columns."""

    first: int
    columns: tuple[ColumnRun, ...] | None = None

    def to_dict(self) -> dict:
        return {"first": self.first,
                "columns": None if self.columns is None else [run.to_dict() for run in self.columns]}

    @classmethod
    def from_dict(cls, data: dict) -> RowRun:
        columns = data.get("columns")
        return cls(int(data["first"]), None if columns is None else tuple(ColumnRun.from_dict(c) for c in columns))


@dataclass(frozen=True)
class Tiles:
    """The GEMM rows read, a class for each of them and one for each column."""

    rows: np.ndarray
    row_class: np.ndarray
    column_class: np.ndarray

    def class_of(self, row: int | None) -> int:
        """The class of GEMM row `row`, or the largest class where that row is not read."""
        if row is not None:
            found = np.flatnonzero(self.rows == row)
            if len(found):
                return int(self.row_class[found[0]])
        return int(np.bincount(self.row_class).argmax())

    def rows_in(self, row_class: int) -> frozenset[int]:
        return frozenset(self.rows[self.row_class == row_class].tolist())

    def first_row(self, row_class: int) -> int:
        """The lowest GEMM row of a class."""
        return int(self.rows[self.row_class == row_class].min())

    def by_row(self) -> np.ndarray:
        """The class of every GEMM row 0, 1, ... (every row is read at a proxy)."""
        classes = np.empty(len(self.rows), dtype=np.int64)
        classes[self.rows] = self.row_class
        return classes

    def spans(self, firsts=()) -> list[range]:
        """Runs of neighbouring columns in one class, also cut at `firsts`."""
        cuts = sorted({0, *firsts, *(j for j in range(1, len(self.column_class))
                                     if self.column_class[j] != self.column_class[j - 1])})
        return [range(a, b) for a, b in zip(cuts, [*cuts[1:], len(self.column_class)])]


@dataclass(frozen=True)
class Tiling:
    """What `measure_tiles` found: the main class's runs of columns and the runs of rows."""

    columns: list[ColumnRun]
    columns_note: str
    rows: list[RowRun]
    rows_note: str


def proxy(layer: Layer) -> Layer:
    """The VALID layer with the same GEMM as `layer` (same N, OH, OW, filter, strides and
    dilation): every output window lies inside its image."""
    n, oh, ow, _ = layer.output_shape
    kh, kw, c, _ = layer.filter_shape
    h = (oh - 1) * layer.strides[0] + (kh - 1) * layer.dilation[0] + 1
    w = (ow - 1) * layer.strides[1] + (kw - 1) * layer.dilation[1] + 1
    return Layer((n, h, w, c), layer.filter_shape, layer.strides, "VALID", layer.dilation, layer.name)


def rows_read(layer: Layer, op: str) -> np.ndarray:
    """The GEMM rows the column layout reads: every output pixel (forward), every tap
    (filter gradient), every position of `window_sets` (input gradient), in that order."""
    kh, kw, c, _ = layer.filter_shape
    if op == "conv2d_backprop_filter":
        return np.arange(kh * kw * c)
    if op == "conv2d":
        return np.arange(int(np.prod(layer.output_shape[:3])))
    return np.array([window_row(layer, w) for windows in window_sets(layer) for w in windows], dtype=np.int64)


def column_layout_outputs(backend, layer: Layer, op: str, operand: np.ndarray, constant: float,
                          windows: tuple | None = None) -> np.ndarray:
    """(calls, rows read, columns): for each call's fp16 column operand (columns, K), what
    every GEMM row read computes in every column, the other operand `constant`; the input
    gradient reads the positions of `windows` (one of `window_sets`; default the first)."""
    kh, kw, c, cout = layer.filter_shape
    x = np.full(layer.input_shape, constant, np.float16)
    if op == "conv2d":  # taps (i, j, c) in order
        outputs = run_ops(backend, layer, op, [(x, np.ascontiguousarray(o.T).reshape(layer.filter_shape))
                                               for o in operand])
        return np.stack([y.reshape(-1, cout) for y in outputs]).astype(np.float64)
    if op == "conv2d_backprop_filter":  # positions (n, oh, ow) in order
        outputs = run_ops(backend, layer, op, [(x, np.ascontiguousarray(o.T).reshape(layer.output_shape))
                                               for o in operand])
        return np.stack([y.reshape(kh * kw * c, cout) for y in outputs]).astype(np.float64)
    windows = windows or window_sets(layer)[0]  # input gradient: column (t, c) is the filter's (i, j, c, :)
    image = np.array([wd[0] for wd in windows])
    dy = np.zeros(layer.output_shape, np.float16)
    dy[image, [wd[1] for wd in windows], [wd[2] for wd in windows], :] = constant
    outputs = run_ops(backend, layer, op, [(dy, o.reshape(layer.filter_shape)) for o in operand])
    pixel_rows = np.stack([wd[3] for wd in windows])
    pixel_cols = np.stack([wd[4] for wd in windows])
    return np.stack([dx[image[:, None, None], pixel_rows, pixel_cols, :].reshape(len(windows), -1)
                     for dx in outputs]).astype(np.float64)


def tile_classes(backend, layer: Layer, op: str, seed: int = 0) -> Tiles:
    """Rows read and columns grouped by their outputs on `SIGNATURE_CALLS` seeded random
    patterns, each in every column; classes numbered in order of their first member."""
    k, n = column_k(layer, op), column_count(layer, op)
    patterns = np.random.default_rng([seed, k, n]).standard_normal((SIGNATURE_CALLS, 1, k)) / np.sqrt(k)
    operand = np.broadcast_to(patterns.astype(np.float16), (SIGNATURE_CALLS, n, k))  # sums near 1
    with np.errstate(over="ignore", invalid="ignore"):
        if op == "conv2d_backprop_input":  # every set of isolated positions in turn, as rows_read orders them
            grid = np.concatenate([column_layout_outputs(backend, layer, op, operand, _ROUNDING_CONSTANT, windows)
                                   for windows in window_sets(layer)], axis=1).astype(np.float16)
        else:
            grid = column_layout_outputs(backend, layer, op, operand, _ROUNDING_CONSTANT).astype(np.float16)
    bits = grid.view(np.uint16)  # (calls, rows, columns)
    return Tiles(rows_read(layer, op), _classes(bits.transpose(1, 0, 2).reshape(bits.shape[1], -1)),
                 _classes(bits.transpose(2, 0, 1).reshape(bits.shape[2], -1)))


def _classes(signatures: np.ndarray) -> np.ndarray:
    """A class for each row of `signatures`, equal rows one class, numbered by first row."""
    seen: dict[bytes, int] = {}  # (a dict of the rows' bytes: np.unique(axis=0) sorts them, far slower)
    return np.array([seen.setdefault(row.tobytes(), len(seen)) for row in np.ascontiguousarray(signatures)],
                    np.int64)


def _span_calls(k: int, spans: list[range]) -> int:
    return sum(-(-(3 * k + 1000) // len(span)) for span in spans)


def _over_budget(layer: Layer, op: str, calls: int) -> str:
    """'' if `calls` op calls fit `MAX_CALLS` and `MAX_WORK`, else why not."""
    kh, kw, c, _ = layer.filter_shape
    m = kh * kw * c if op == "conv2d_backprop_filter" else int(np.prod(layer.output_shape[:3]))
    work = calls * m * column_count(layer, op) * column_k(layer, op)
    if calls > MAX_CALLS:
        return f"about {calls} calls, over {MAX_CALLS}"
    return f"about {work:.2g} multiply-adds, over {MAX_WORK:.2g}" if work > MAX_WORK else ""


class _SpanMeasure:
    """`structure.measure_rows` at one GEMM row, the patterns spread one a column over a run
    of columns, on one cache of calls (other rows and other runs reuse them)."""

    def __init__(self, backend, layer: Layer, op: str):
        self.backend, self.layer, self.op = backend, layer, op
        self.cache: dict[tuple, np.ndarray] = {}

    def _where(self, row: int) -> tuple[tuple | None, int]:
        """(the window set that reads `row`, or None: every row is read; its place there)."""
        if self.op != "conv2d_backprop_input":
            return None, row
        for windows in window_sets(self.layer):
            rows = [window_row(self.layer, w) for w in windows]
            if row in rows:
                return windows, rows.index(row)
        raise ValueError(f"GEMM row {row} has no window inside the image")

    def __call__(self, row: int, span: range) -> Structure:
        windows, position = self._where(row)
        return measure_rows(lambda patterns, scale: self._outputs(patterns, scale, span, windows)[:, position],
                            column_k(self.layer, self.op))

    def _outputs(self, patterns: np.ndarray, scale: float, span: range, windows) -> np.ndarray:
        key = (span.start, span.stop, None if windows is None else window_row(self.layer, windows[0]),
               patterns.shape, float(scale), hashlib.sha256(np.ascontiguousarray(patterns).tobytes()).digest())
        if key not in self.cache:
            values = blocks(patterns, len(span), scale)  # (calls, len(span), K)
            operand = np.zeros((len(values), column_count(self.layer, self.op), values.shape[2]), np.float16)
            operand[:, span.start:span.stop] = values
            grid = column_layout_outputs(self.backend, self.layer, self.op, operand, scale, windows)
            per_pattern = grid[:, :, span.start:span.stop].transpose(0, 2, 1).reshape(-1, grid.shape[1])
            self.cache[key] = per_pattern[:len(patterns)]
        return self.cache[key]

    def runs(self, row: int, spans: list[range]) -> tuple[ColumnRun, ...]:
        """Runs of columns (neighbouring spans with one structure merged) at one GEMM row."""
        measured = [self(row, span) for span in spans]
        return tuple(ColumnRun(span.start, s) for i, (span, s) in enumerate(zip(spans, measured))
                     if i == 0 or s != measured[i - 1])


def measure_tiles(backend, layer: Layer, op: str, main_row: int | None, seed: int = 0,
                  window_probe: bool = True) -> Tiling:
    """The main class's runs of columns and the runs of rows of `op` at `layer`'s proxy (see
    the module docstring). `main_row`: the GEMM row the layer's own crafted rows are read at
    (None: the largest class is the main one). `window_probe` False: the column layout only
    (its other operand a constant, as `batch_order.BatchInnermost` needs)."""
    try:
        at = proxy(layer)
    except InvalidArgument as exc:
        runs, note = measure_columns(backend, layer, op) if window_probe else ([], "no proxy layer: columns not measured")
        return Tiling(runs, note, [], f"no proxy layer ({exc}): rows not measured")
    tiles = tile_classes(backend, at, op, seed)
    main = tiles.class_of(main_row)
    span_measure, k = _SpanMeasure(backend, at, op), column_k(at, op)
    capacity, why = column_capacity(at, op, tiles.rows_in(main))
    if window_probe and capacity and column_calls(at, op, capacity) <= WINDOW_CALLS:
        columns, columns_note = measure_columns(backend, at, op, tiles.rows_in(main))
    elif len(tiles.spans()) < 2:
        columns, columns_note = [], why or "one kernel for every column: the crafted rows' own structure"
    elif not _over_budget(at, op, _span_calls(k, tiles.spans())):
        columns, columns_note = list(span_measure.runs(tiles.first_row(main), tiles.spans())), ""
    else:
        over = _over_budget(at, op, _span_calls(k, tiles.spans()))
        columns, columns_note = [], f"{len(tiles.spans())} runs of columns: {over}; columns not measured"
    others = sorted(set(tiles.row_class.tolist()) - {main})
    if not others:
        return Tiling(columns, columns_note, [], "")
    spans = tiles.spans([run.first for run in columns])
    main_calls = _span_calls(k, spans) if op == "conv2d_backprop_input" and not columns else 0
    over = _over_budget(at, op, len(others) * _span_calls(k, spans) + main_calls)
    if over:
        return Tiling(columns, columns_note, [], f"{len(others) + 1} classes of rows: {over}; rows not measured")
    if main_calls:  # the input gradient's rows are modelled column by column: the main class's too
        columns, columns_note = list(span_measure.runs(tiles.first_row(main), spans)), ""
    structure_of = {c: span_measure.runs(tiles.first_row(c), spans) for c in others}
    classes = tiles.by_row()
    row_runs = [RowRun(r, None if c == main else structure_of[c])
                for r, c in enumerate(classes.tolist()) if r == 0 or c != classes[r - 1]]
    return Tiling(columns, columns_note, row_runs, "")


def _class_model(layer: Layer, op: str, runs: tuple[ColumnRun, ...], combine: str) -> AccumulationModel | None:
    """The model of one class of rows: its columns' (None where a structure gives none)."""
    model_of = _column_model_of(runs, column_k(layer, op))
    return model_of and model_by_column(layer, op, model_of, combine)


def row_models(layer: Layer, op: str, runs: list[RowRun], main_model: AccumulationModel,
               combine: str = "fp16") -> AccumulationModel | None:
    """``rows(M_0 * n_0, M_1 * n_1, ...)`` from the forward's or filter gradient's runs of rows,
    the main class taking `main_model` (None where one model serves every row, or a class
    gives none). The input gradient's rows are dx pixels: `dx_row_models`."""
    if len(runs) < 2:
        return None
    models = [main_model if run.columns is None else _class_model(layer, op, run.columns, combine) for run in runs]
    return _rows_model(models, [nxt.first - run.first for run, nxt in zip(runs, runs[1:])] + [1])


def dx_row_models(layer: Layer, runs: list[RowRun], main_columns: list[ColumnRun],
                  combine: str = "fp16") -> AccumulationModel | None:
    """``rows(...)`` over the input gradient's dx pixels: each takes, for each tap, the kernel
    of the dy position that tap reads (its GEMM row), from `main_columns` (the main class's)
    or its class's columns (None where one model serves every pixel, or a run gives none)."""
    if len(runs) < 2:
        return None
    return _rows_model(*_dx_pixel_runs(layer, runs, list(main_columns), combine))


def _rows_model(models: list[AccumulationModel | None], counts: list[int]) -> AccumulationModel | None:
    known = [m for m in models if m is not None]
    if len(known) < len(models) or len(set(known)) < 2:
        return None
    return Rows(models=tuple(m for m, n in zip(known, counts) for _ in range(n)))


def _column_model_of(runs, k: int):
    """column -> the model of its run; None where a run's structure gives none."""
    firsts, models = [r.first for r in runs], [column_model(r.structure, k) for r in runs]
    if any(m is None for m in models):
        return None
    return lambda column: models[int(np.searchsorted(firsts, column, side="right")) - 1]


def _dx_pixel_runs(layer: Layer, runs: list[RowRun], main_columns: list[ColumnRun], combine: str):
    """(models, counts): runs of dx pixels (n, h, w) with one model. A pixel's column (tap t,
    channel c) takes the kernel of GEMM row p, the dy position tap t of p reads the pixel
    at; taps that read no dy position (padding, stride) sum zeros: the main kernel."""
    op, k = "conv2d_backprop_input", layer.filter_shape[3]
    if not main_columns:
        return [None], [1]
    model_of = [_column_model_of(main_columns if run.columns is None else run.columns, k) for run in runs]
    if any(of is None for of in model_of):
        return [None], [1]
    firsts = [run.first for run in runs]
    main = model_of[next(i for i, run in enumerate(runs) if run.columns is None)]
    n, h, w, _ = layer.input_shape
    kh, kw, c_in, _ = layer.filter_shape
    _, oh, ow, _ = layer.output_shape
    (top, _), (left, _) = layer.pads
    (sh, sw), (dh, dw) = layer.strides, layer.dilation
    main_model = model_by_column(layer, op, main, combine)
    reached = set()  # the pixels a non-main row reaches
    for run, nxt in zip(runs, [*firsts[1:], n * oh * ow]):
        if run.columns is None:
            continue
        for row in range(run.first, nxt):
            b, rest = divmod(row, oh * ow)
            for i in range(kh):
                for j in range(kw):
                    pixel = (b, (rest // ow) * sh - top + i * dh, (rest % ow) * sw - left + j * dw)
                    if 0 <= pixel[1] < h and 0 <= pixel[2] < w:
                        reached.add(pixel)

    def tap_runs(pixel) -> tuple[int, ...]:
        """For each tap t, the run of the GEMM row it reads the pixel at (-1: none)."""
        b, y, x = pixel
        out = []
        for t in range(kh * kw):
            (a, off_a), (e, off_e) = divmod(y + top - (t // kw) * dh, sh), divmod(x + left - (t % kw) * dw, sw)
            inside = not off_a and not off_e and 0 <= a < oh and 0 <= e < ow
            out.append(int(np.searchsorted(firsts, (b * oh + a) * ow + e, side="right")) - 1 if inside else -1)
        return tuple(out)

    model_of_taps = {}  # one model for each distinct (run of every tap): pixels share them
    pixel_models = {}
    for pixel in reached:
        taps = tap_runs(pixel)
        if taps not in model_of_taps:
            def of(column: int, taps=taps) -> AccumulationModel | None:
                run_index = taps[column // c_in]
                return main(column) if run_index < 0 else model_of[run_index](column)
            model_of_taps[taps] = model_by_column(layer, op, of, combine)
        pixel_models[pixel] = model_of_taps[taps]
    models: list[AccumulationModel | None] = []
    counts: list[int] = []
    for pixel in np.ndindex(n, h, w):
        model = pixel_models.get(pixel, main_model)
        if models and models[-1] == model:
            counts[-1] += 1
        else:
            models.append(model)
            counts.append(1)
    return models, counts
