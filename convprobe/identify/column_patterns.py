"""Crafted rows through every column of a conv op's GEMM: the structure column by column.

A CPU conv op is a GEMM: forward im2col(x) x filter, the input gradient dy x
filter^T scattered into dx (col2im), the filter gradient im2col(x)^T x dy. The
micro kernel can change with the output column: on oneDNN-off fp16 accumulation,
whole blocks of 16 columns round products to fp16, the next block of 8 sums in two
lanes and the last few columns add exact products in fp16 (measured by this module;
docs/identify.md, "What the map shows"; `addition=fp32` matches as well at the K seen). `layer_patterns`
puts row r in column r, so where columns differ it measures a mixture. Here every
row goes through every column: the rows lie in the operand that indexes the
GEMM's rows, the other operand is the constant, and every column's output is read.

- **forward**: row r fills the input window of one output position (windows
  disjoint, inside the image); columns are the output channels.
- **input gradient**: row r is dy at one position, every other dy zero; tap t of
  that position lands on its own dx pixel, where channel c reads GEMM column (t, c)
  alone (col2im adds only zeros to it); columns are (tap, channel) in filter order.
  Strides and dilation only move the pixels.
- **filter gradient**: row r is input channel r at the pixels one tap reads at
  every position (a tap whose reads all lie inside the image), dy constant;
  columns are the output channels.

`measure_columns` runs `structure.measure_rows` for each column on one cache of
calls: a column whose outputs equal a measured column's on every call that
measurement made would take the same path, so it gets the same structure with no
call of its own. `column_models` turns the runs of columns into one model.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from convprobe.emulation import AccumulationModel
from convprobe.emulation.composites import Columns, SplitK
from convprobe.identify.spot import spot
from convprobe.probes.layers import Layer, run_ops
from convprobe.identify.candidates import candidate_models
from convprobe.identify.structure import Structure, blocks, measure_rows

__all__ = ["ColumnRun", "column_count", "column_k", "column_capacity", "column_calls", "column_outputs", "measure_columns",
           "column_models", "column_model", "model_by_column", "window_sets", "window_row", "windows_in", "spot_rows", "MAX_CALLS"]

#: Most op calls one column measurement may make (about 3 K + 1000 rows, `capacity` a call).
MAX_CALLS = 512


@dataclass(frozen=True)
class ColumnRun:
    """Columns `first` up to the next run's first (or the last column) share `structure`."""

    first: int
    structure: Structure

    def to_dict(self) -> dict:
        return {"first": self.first, "structure": self.structure.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> ColumnRun:
        return cls(int(data["first"]), Structure(**data["structure"]))


def column_count(layer: Layer, op: str) -> int:
    """The GEMM's output columns: output channels, or (tap, channel) for the input gradient."""
    kh, kw, c, cout = layer.filter_shape
    return kh * kw * c if op == "conv2d_backprop_input" else cout


def column_k(layer: Layer, op: str) -> int:
    """The length of one column's reduction: C_out for the input gradient (one tap), else K."""
    return layer.filter_shape[3] if op == "conv2d_backprop_input" else layer.k(op)


def _pixels(layer: Layer, oh: int, ow: int) -> tuple[np.ndarray, np.ndarray]:
    """The input rows and columns (KH, KW) that output position (oh, ow) reads."""
    kh, kw, _, _ = layer.filter_shape
    (top, _), (left, _) = layer.pads
    rows = oh * layer.strides[0] - top + np.arange(kh) * layer.dilation[0]
    cols = ow * layer.strides[1] - left + np.arange(kw) * layer.dilation[1]
    return np.broadcast_to(rows[:, None], (kh, kw)), np.broadcast_to(cols[None, :], (kh, kw))


@functools.lru_cache(maxsize=16)
def window_sets(layer: Layer) -> tuple[tuple, ...]:
    """Sets of disjoint in-image windows, each (n, oh, ow, rows, cols) of an output position
    whose window lies inside the image and shares no pixel with an earlier one's, that
    together hold every such position, each set picked greedily from the positions left."""
    n_images, h, w, _ = layer.input_shape
    _, oh, ow, _ = layer.output_shape
    left = [(i, j) for i in range(oh) for j in range(ow)]
    sets = []
    while left:
        used, picked, rest = np.zeros((h, w), dtype=bool), [], []
        for i, j in left:
            rows, cols = _pixels(layer, i, j)
            if rows.min() < 0 or cols.min() < 0 or rows.max() >= h or cols.max() >= w:
                continue  # never inside: in no set
            if used[rows, cols].any():
                rest.append((i, j))
                continue
            used[rows, cols] = True
            picked.append((i, j, rows, cols))
        if not picked:
            break
        sets.append(tuple((n, i, j, rows, cols) for n in range(n_images) for i, j, rows, cols in picked))
        left = rest
    return tuple(sets)


@functools.lru_cache(maxsize=16)
def _tap_reads(layer: Layer, th: int, tw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image, row, column) of the pixel tap (th, tw) reads at every output position, in
    (n, oh, ow) order (once per layer)."""
    n, oh, ow, _ = layer.output_shape
    pixels = [_pixels(layer, i, j) for i in range(oh) for j in range(ow)]
    rows = np.array([r[th, tw] for r, _ in pixels] * n)
    cols = np.array([c[th, tw] for _, c in pixels] * n)
    return np.repeat(np.arange(n), oh * ow), rows, cols


def window_row(layer: Layer, window: tuple) -> int:
    """The GEMM row of a window's output position (n, oh, ow)."""
    _, oh, ow, _ = layer.output_shape
    return (window[0] * oh + window[1]) * ow + window[2]


def windows_in(layer: Layer, gemm_rows=None) -> tuple:
    """The first set of `window_sets` whose GEMM rows are in `gemm_rows` (all where None)."""
    windows = window_sets(layer)[0] if window_sets(layer) else ()
    return tuple(w for w in windows if gemm_rows is None or window_row(layer, w) in gemm_rows)


def spot_rows(layer: Layer) -> range:
    """The filter gradient's GEMM rows its crafted rows pass through: the spot tap's channels."""
    where = spot(layer, "conv2d_backprop_filter")
    if where is None:
        raise ValueError("no tap is read inside the image at every position: the filter gradient has no spot rows")
    th, tw = where
    kw, c = layer.filter_shape[1], layer.filter_shape[2]
    return range((th * kw + tw) * c, (th * kw + tw + 1) * c)


def column_capacity(layer: Layer, op: str, gemm_rows=None) -> tuple[int, str]:
    """(rows one call carries, '' or why the columns cannot be measured), the crafted rows kept
    to the GEMM rows in `gemm_rows` (all where None)."""
    if op == "conv2d_backprop_filter":
        if spot(layer, op) is None:
            return 0, "no tap is read inside the image at every position: columns not measured"
        if gemm_rows is not None and not set(spot_rows(layer)) <= set(gemm_rows):
            return 0, "the tap's channels lie in two classes of rows: columns not measured"
        return layer.input_shape[3], ""
    capacity = len(windows_in(layer, gemm_rows))
    if not capacity:
        return 0, "no output window lies wholly inside the image: columns not measured"
    return capacity, ""


def column_calls(layer: Layer, op: str, capacity: int) -> int:
    """About how many op calls measuring the columns takes (about 3 K + 1000 rows)."""
    return -(-(3 * column_k(layer, op) + 1000) // capacity)


def column_outputs(backend, layer: Layer, op: str, patterns: np.ndarray, scale: float, gemm_rows=None) -> np.ndarray:
    """(rows, columns): sum_k patterns[r, k] as column j of `op`'s GEMM computes it, for every
    pattern r and column j (see the module docstring), at GEMM rows in `gemm_rows` (all where None)."""
    capacity, why = column_capacity(layer, op, gemm_rows)
    if not capacity:
        raise ValueError(why)
    kh, kw, c, cout = layer.filter_shape
    operands = []
    if op == "conv2d_backprop_filter":
        where = spot(layer, op)
        assert where is not None  # (`column_capacity` carries no rows without a spot tap)
        th, tw = where
        image, rows, cols = _tap_reads(layer, th, tw)
        constant = np.full(layer.output_shape, scale, np.float16)
        for values in blocks(patterns, capacity, scale):  # values (C, N*OH*OW)
            x = np.zeros(layer.input_shape, np.float16)
            x[image, rows, cols, :] = values.T
            operands.append((x, constant))
        outputs = run_ops(backend, layer, op, operands)
        return np.concatenate([y[th, tw] for y in outputs]).astype(np.float64)[:len(patterns)]
    windows = windows_in(layer, gemm_rows)
    image = np.array([wd[0] for wd in windows])
    rows = np.stack([wd[3] for wd in windows])  # (window, KH, KW): the pixels each tap reads
    cols = np.stack([wd[4] for wd in windows])
    if op == "conv2d":
        constant = np.full(layer.filter_shape, scale, np.float16)
        for values in blocks(patterns, capacity, scale):  # taps (i, j, c) in order
            x = np.zeros(layer.input_shape, np.float16)
            x[image[:, None, None], rows, cols, :] = values.reshape(-1, kh, kw, c)
            operands.append((x, constant))
        outputs = run_ops(backend, layer, op, operands)
        positions = (image, np.array([wd[1] for wd in windows]), np.array([wd[2] for wd in windows]))
        return np.concatenate([y[positions] for y in outputs]).astype(np.float64)[:len(patterns)]
    # input gradient: dy at the window's output position; tap (i, j) lands on pixel rows[i, j], cols[i, j]
    constant = np.full(layer.filter_shape, scale, np.float16)
    for values in blocks(patterns, capacity, scale):
        dy = np.zeros(layer.output_shape, np.float16)
        dy[image, [wd[1] for wd in windows], [wd[2] for wd in windows], :] = values
        operands.append((dy, constant))
    outputs = run_ops(backend, layer, op, operands)
    return np.concatenate([dx[image[:, None, None], rows, cols, :].reshape(capacity, -1)
                           for dx in outputs]).astype(np.float64)[:len(patterns)]


def measure_columns(backend, layer: Layer, op: str, gemm_rows=None) -> tuple[list[ColumnRun], str]:
    """(runs of columns with one structure, '' or why the columns were not measured), the
    crafted rows kept to the GEMM rows in `gemm_rows` (a set; all where None: one class of rows)."""
    capacity, why = column_capacity(layer, op, gemm_rows)
    if not capacity:
        return [], why
    k = column_k(layer, op)
    calls = column_calls(layer, op, capacity)
    if calls > MAX_CALLS:
        return [], f"{capacity} rows fit one call: about {calls} calls, over {MAX_CALLS}; columns not measured"
    cache: dict[tuple, np.ndarray] = {}
    measured: list[tuple[int, list[tuple], Structure]] = []  # (column, calls it made, structure)

    def runner(column: int, keys: list):
        def run(patterns: np.ndarray, scale: float) -> np.ndarray:
            key = (patterns.shape, float(scale), hashlib.sha256(np.ascontiguousarray(patterns).tobytes()).digest())
            if key not in cache:
                cache[key] = column_outputs(backend, layer, op, patterns, scale, gemm_rows).astype(np.float16).view(np.uint16)
            keys.append(key)
            return cache[key][:, column].view(np.float16).astype(np.float64)
        return run

    per_column = []
    for column in range(column_count(layer, op)):
        same = next((s for col, keys, s in measured
                     if all(np.array_equal(cache[key][:, column], cache[key][:, col]) for key in keys)), None)
        if same is None:
            keys: list[tuple] = []
            same = measure_rows(runner(column, keys), k)
            measured.append((column, keys, same))
        per_column.append(same)
    return [ColumnRun(j, s) for j, s in enumerate(per_column) if j == 0 or s != per_column[j - 1]], ""


def column_model(structure: Structure, k: int) -> AccumulationModel | None:
    """The measured model of one column: the first the structure gives."""
    models = candidate_models(structure, k)
    return models[0] if models else None


def column_models(layer: Layer, op: str, runs: list[ColumnRun], combine: str = "fp16") -> AccumulationModel | None:
    """One model from the runs of columns, where they differ (None where one model serves every
    column, or a column's structure gives none). Forward and filter gradient:
    ``columns(M_0 * n_0, M_1 * n_1, ...)`` by output channel. Input gradient: each dx channel c adds its
    taps' columns (tap, c) in `combine`, in the rotated filter's order (the last tap first),
    as ``splitk(length=C_out, M, first=M_a | M_b ..., combine=...)``; then ``columns`` by channel."""
    if len(runs) < 2:
        return None
    k = column_k(layer, op)
    models = [column_model(r.structure, k) for r in runs]
    if any(m is None for m in models) or len(set(models)) < 2:
        return None
    firsts = [r.first for r in runs]
    return model_by_column(layer, op, lambda column: models[int(np.searchsorted(firsts, column, side="right")) - 1],
                           combine)


def model_by_column(layer: Layer, op: str, model_of, combine: str = "fp16") -> AccumulationModel:
    """One model from `model_of(column)`, the model of each GEMM column (see `column_models`)."""
    kh, kw, c_in, c_out = layer.filter_shape
    channels: list[AccumulationModel]
    if op == "conv2d_backprop_input":
        channels = []
        for c in range(c_in):  # range r of channel c is tap kh*kw-1-r (filter order)
            taps = [model_of((kh * kw - 1 - r) * c_in + c) for r in range(kh * kw)]
            inner, first = taps[-1], taps[:-1]
            while first and first[-1] == inner:
                first.pop()
            channels.append(SplitK(combine, inner=inner, first=tuple(first), length=c_out))
    else:
        channels = [model_of(j) for j in range(c_out)]
    while len(channels) > 1 and channels[-1] == channels[-2]:
        channels.pop()  # the last model serves every channel after it
    if len(channels) == 1:
        return channels[0]
    return Columns(models=tuple(channels))
