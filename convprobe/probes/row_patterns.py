"""Crafted rows through every row of a conv op's GEMM: row blocks with kernels of their own.

A GEMM kernel picks its micro kernel by output tile, the row block as well as the
column block (`column_patterns`). On oneDNN-off fp16 accumulation, 1,7,7,16 * 3,3,16,8
conv2d has 49 GEMM rows (output pixels): rows 0-47 sum in two lanes, row 48, the
remainder of a block of 4, adds rounded products in one chain (README, "shape-true
identification"). The filter gradient's rows are its taps (i, j, c).

Here every row sees the same pattern: the operand that indexes the GEMM's columns
carries the patterns (forward: the filter's output channels; filter gradient: dy's
channels, over the positions (n, oh, ow)), x is a constant, and every row is read. A
row reads the whole pattern only where its window lies inside the image, so the rows
are measured on the layer's *proxy*: the same GEMM (N, OH, OW, filter, strides,
dilation) with VALID padding and an input just large enough, where every window does.
`identify` confirms the resulting spec at the user's own layer.

1. Random patterns in every column, x a constant that rounds products, group the rows
   by their outputs (`SIGNATURE_CALLS` calls).
2. The class of the row the layer's own measurement read keeps that structure; each
   other class has each run of columns measured (`structure.measure_rows`) at its first
   row, the patterns in that run's columns, through one cache of calls.

The input gradient is not measured here: its GEMM rows are dy positions that col2im
adds into dx together, so no dx output reads one row.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from convprobe.errors import InvalidArgument
from convprobe.probes.column_patterns import ColumnRun, column_models, column_spec
from convprobe.probes.layers import Layer
from convprobe.probes.structure import Structure, blocks, measure_rows

__all__ = ["RowRun", "ROW_OPS", "SIGNATURE_CALLS", "MAX_CALLS", "proxy", "reference_row", "row_count", "row_outputs", "row_classes",
           "measure_row_runs", "row_models"]

#: The ops whose GEMM rows are outputs: forward (pixels) and filter gradient (taps).
ROW_OPS = ("conv2d", "conv2d_backprop_filter")
#: Calls of random patterns that group the rows.
SIGNATURE_CALLS = 4
#: Most op calls the rows' measurement may make (about 3 K + 1000 patterns a class and
#: run of columns, one pattern a column a call).
MAX_CALLS = 768
#: The constant operand of the random calls: 1 + 2**-10, so a product rounded to fp16 shows.
_ROUNDING_CONSTANT = 1.0 + 2.0**-10


@dataclass(frozen=True)
class RowRun:
    """GEMM rows `first` up to the next run's first (or the last row) share a kernel: the
    layer's own measured structure (`columns` None) or these runs of columns."""

    first: int
    columns: tuple[ColumnRun, ...] | None = None

    def to_dict(self) -> dict:
        return {"first": self.first,
                "columns": None if self.columns is None else [run.to_dict() for run in self.columns]}

    @classmethod
    def from_dict(cls, data: dict) -> RowRun:
        columns = data.get("columns")
        return cls(int(data["first"]), None if columns is None else tuple(ColumnRun.from_dict(c) for c in columns))


def proxy(layer: Layer) -> Layer:
    """The VALID layer with the same GEMM as `layer` (same N, OH, OW, filter, strides and
    dilation): every output window lies inside its image."""
    n, oh, ow, _ = layer.output_shape
    kh, kw, c, _ = layer.filter_shape
    h = (oh - 1) * layer.strides[0] + (kh - 1) * layer.dilation[0] + 1
    w = (ow - 1) * layer.strides[1] + (kw - 1) * layer.dilation[1] + 1
    return Layer((n, h, w, c), layer.filter_shape, layer.strides, "VALID", layer.dilation, layer.name)


def row_count(layer: Layer, op: str) -> int:
    """The GEMM's rows: N*OH*OW output pixels, or the filter gradient's KH*KW*C taps."""
    kh, kw, c, _ = layer.filter_shape
    return kh * kw * c if op == "conv2d_backprop_filter" else int(np.prod(layer.output_shape[:3]))


def row_outputs(backend, layer: Layer, op: str, values: np.ndarray, constant: float, columns: range) -> np.ndarray:
    """(patterns, rows): each call's fp16 patterns values[call] (len(columns), K) in the
    given GEMM columns of `op` at `layer` (a proxy: every window inside), x the constant,
    summed by every GEMM row."""
    from convprobe.probes.layers import run_ops

    x = np.full(layer.input_shape, constant, np.float16)
    kh, kw, c, cout = layer.filter_shape
    operands = []
    for call in values:
        if op == "conv2d":  # taps (i, j, c) in order
            w = np.zeros((kh * kw * c, cout), np.float16)
            w[:, columns.start:columns.stop] = call.T
            operands.append((x, w.reshape(layer.filter_shape)))
        else:  # positions (n, oh, ow) of the batch, in order
            dy = np.zeros((int(np.prod(layer.output_shape[:3])), cout), np.float16)
            dy[:, columns.start:columns.stop] = call.T
            operands.append((x, dy.reshape(layer.output_shape)))
    outputs = run_ops(backend, layer, op, operands)
    rows = row_count(layer, op)
    return np.concatenate([y.reshape(rows, cout)[:, columns.start:columns.stop].T for y in outputs])


def reference_row(layer: Layer, op: str, columns_measured: bool) -> int | None:
    """The GEMM row at which the layer's own structure was measured: the column probe's
    first window (forward, columns measured), else the crafted rows' spot (image 0;
    filter gradient: the spot tap's channel 0). None where neither was measured."""
    from convprobe.probes.column_patterns import _windows
    from convprobe.probes.layer_patterns import spot

    _, oh, ow, _ = layer.output_shape
    if op == "conv2d" and columns_measured and _windows(layer):
        n, i, j, _, _ = _windows(layer)[0]
        return (n * oh + i) * ow + j
    where = spot(layer, op)
    if where is None:
        return None
    if op == "conv2d":
        return where[0] * ow + where[1]
    kw, c = layer.filter_shape[1], layer.filter_shape[2]
    return (where[0] * kw + where[1]) * c


def row_classes(backend, layer: Layer, op: str, seed: int = 0) -> np.ndarray:
    """A class number for every GEMM row of `op` at the proxy `layer`: rows with equal
    outputs on `SIGNATURE_CALLS` calls of seeded random patterns share one, numbered in
    order of their first row."""
    k, cout = layer.k(op), layer.filter_shape[3]
    values = np.random.default_rng([seed, k, cout]).standard_normal((SIGNATURE_CALLS, cout, k))
    values = (values / np.sqrt(k)).astype(np.float16)  # sums near 1: far from overflow
    with np.errstate(over="ignore", invalid="ignore"):
        outputs = row_outputs(backend, layer, op, values, _ROUNDING_CONSTANT, range(cout))
    signatures = np.ascontiguousarray(outputs.astype(np.float16).view(np.uint16).T)  # (rows, calls * cout)
    _, first_of, classes = np.unique(signatures, axis=0, return_index=True, return_inverse=True)
    renumber = np.argsort(np.argsort(first_of))
    return renumber[classes.reshape(-1)]


def measure_row_runs(backend, layer: Layer, op: str, reference_row: int, column_runs: list[ColumnRun],
                     seed: int = 0) -> tuple[list[RowRun], str]:
    """(runs of GEMM rows, '' or why the rows were not measured); no runs where every row
    is in the reference row's class. `column_runs` are the layer's measured runs of
    columns (one run of every column where they were not measured)."""
    if op not in ROW_OPS:
        return [], "the input gradient's GEMM rows are added together by col2im: rows not measured"
    try:
        at = proxy(layer)
    except InvalidArgument as exc:
        return [], f"no proxy layer: {exc}"
    classes = row_classes(backend, at, op, seed)
    if len(set(classes.tolist())) == 1:
        return [], ""
    reference = classes[reference_row]
    others = sorted(set(classes.tolist()) - {reference})
    cout, k = layer.filter_shape[3], layer.k(op)
    firsts = [run.first for run in column_runs] or [0]
    spans = [range(f, nxt) for f, nxt in zip(firsts, [*firsts[1:], cout])]
    calls = len(others) * sum(-(-(3 * k + 1000) // len(span)) for span in spans)
    if calls > MAX_CALLS:
        return [], (f"{len(others) + 1} classes of rows; measuring them would take about {calls} calls, "
                    f"over {MAX_CALLS}: rows not measured")
    cache: dict[tuple, np.ndarray] = {}

    def runner(row: int, span: range):
        def run(patterns: np.ndarray, scale: float) -> np.ndarray:
            key = (span.start, patterns.shape, float(scale),
                   hashlib.sha256(np.ascontiguousarray(patterns).tobytes()).digest())
            if key not in cache:
                values = blocks(patterns, len(span), scale)
                cache[key] = row_outputs(backend, at, op, values, scale, span)[:len(patterns)].astype(np.float64)
            return cache[key][:, row]
        return run

    structure_of = {}
    for c in others:
        row = int(np.flatnonzero(classes == c)[0])
        measured = [measure_rows(runner(row, span), k) for span in spans]
        structure_of[c] = tuple(ColumnRun(f, s) for i, (f, s) in enumerate(zip(firsts, measured))
                                if i == 0 or s != measured[i - 1])
    runs = []
    for r, c in enumerate(classes.tolist()):
        if r == 0 or c != classes[r - 1]:
            runs.append(RowRun(r, None if c == reference else structure_of[c]))
    return runs, ""


def _class_spec(layer: Layer, op: str, runs: tuple[ColumnRun, ...], combine: str) -> str | None:
    """The spec of one class of rows: its columns' (None where a structure gives no spec)."""
    by_column = column_models(layer, op, list(runs), combine)
    return by_column or column_spec(runs[0].structure, layer.k(op))


def row_models(layer: Layer, op: str, runs: list[RowRun], reference_spec: str, combine: str = "fp16") -> str | None:
    """``rows(S_0 * n_0, S_1 * n_1, ...)`` from the runs of rows, the reference class taking
    `reference_spec` (None where one model serves every row, or a class gives no spec)."""
    if len(runs) < 2:
        return None
    specs = [reference_spec if run.columns is None else _class_spec(layer, op, run.columns, combine) for run in runs]
    if None in specs or len(set(specs)) < 2:
        return None
    counts = [nxt.first - run.first for run, nxt in zip(runs, runs[1:])] + [1]
    from convprobe.emulation import parse_model

    return parse_model(f"rows({', '.join(f'{s} * {n}' for s, n in zip(specs, counts))})").to_spec()
