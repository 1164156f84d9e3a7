"""Crafted rows placed in a conv layer's three ops, at the layer's exact shape.

Forward: x is the constant and the filter column of output channel o carries row
o's terms over the taps (i, j, c). Input gradient: dy is the constant and the
180-degree rotated filter carries input channel c's row over (i, j, o), the order
`convprobe.emulation.conv2d_backprop_input` reduces (strided, each dx pixel reads one
phase of those taps: it is read by GEMM row, `row_groups`, never at a spot). Filter gradient: x
is the constant and dy's channel o carries the row over the batch positions
(n, oh, ow). Rows are read at an output whose window lies inside the image. Where no forward output
has one (a 3x3 SAME conv of a 2x2 image), the rows are read at the output that reads the
most in-bounds taps, on those taps alone (`partial_window`): padded taps add zeros, which
change no partial sum, so the order and formats measured there are the kernel's over the
whole K, and the measured partial-sum starts are mapped back to K positions.

One row a channel measures a mixture where the GEMM's tiles differ, so `measure`
also groups the GEMM's rows and columns by kernel and measures each
(`tile_patterns`, `column_patterns`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict

import numpy as np

from convprobe.emulation import AccumulationModel, Chunked
from convprobe.emulation.composites import SplitK
from convprobe.identify.batch_order import BatchInnermost
from convprobe.identify.column_patterns import column_k, column_model
from convprobe.identify.input_gradient_layout import AsForward, forward_layer
from convprobe.identify.spot import spot
from convprobe.identify.tile_patterns import measure_tiles
from convprobe.probes.layers import Layer, run_ops
from convprobe.identify.candidates import candidate_models, candidate_specs
from convprobe.identify.structure import FP16_PROBE, FP32_PROBE, Probe, Structure, blocks, measure_rows

__all__ = ["measure", "pattern_columns", "pattern_rows", "pattern_outputs", "row_groups", "partial_window"]


def row_groups(layer: Layer, op: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The GEMM rows of `op` grouped by the terms they read inside the operands: (terms,
    rows) per group, the group that reads the most terms first."""
    n, h, w, _ = layer.input_shape
    kh, kw, c, cout = layer.filter_shape  # (a grouped conv's K: one group's c channels, cout / groups)
    cout //= layer.groups
    _, oh, ow, _ = layer.output_shape
    per_dim = []
    for size, k, out, s, d, top in layer.dimensions:
        if op == "conv2d":  # output o reads taps t
            per_dim.append([tuple(t for t in range(k) if 0 <= o * s - top + t * d < size) for o in range(out)])
        elif op == "conv2d_backprop_input":  # dx pixel i reads rotated tap k-1-t where dy[(i + top - t*d) / s] is
            per_dim.append([tuple(sorted(k - 1 - t for t in range(k)  # (a strided layer: one phase of the taps)
                                         if (i + top - t * d) % s == 0 and 0 <= (i + top - t * d) // s < out))
                            for i in range(size)])
        else:  # tap t reads positions o
            per_dim.append([tuple(o for o in range(out) if 0 <= o * s - top + t * d < size) for t in range(k)])
    groups: dict[tuple, list[int]] = {}
    if op == "conv2d_backprop_filter":
        grid = (kh, kw, c)
        for a in range(kh):
            for b in range(kw):
                key = (per_dim[0][a], per_dim[1][b])
                groups.setdefault(key, []).extend(np.ravel_multi_index((a, b, np.arange(c)), grid).tolist())
    else:
        grid = (n, oh, ow) if op == "conv2d" else (n, h, w)
        for i in range(grid[1]):
            for j in range(grid[2]):
                key = (per_dim[0][i], per_dim[1][j])
                groups.setdefault(key, []).extend(np.ravel_multi_index((np.arange(n), i, j), grid).tolist())
    result = []
    for (first, second), rows in groups.items():
        if op == "conv2d":
            leaves = [(a * kw + b) * c + ch for a in first for b in second for ch in range(c)]
        elif op == "conv2d_backprop_input":
            leaves = [(a * kw + b) * cout + o for a in first for b in second for o in range(cout)]
        else:
            leaves = [np.ravel_multi_index((m, i, j), (n, oh, ow)) for m in range(n) for i in first for j in second]
        result.append((np.asarray(leaves, np.int64), np.asarray(sorted(rows), np.int64)))
    return sorted(result, key=lambda group: -len(group[0]))


def pattern_columns(layer: Layer, op: str) -> int:
    """The GEMM columns of `op`, each of which carries one row of terms in a call."""
    return layer.input_shape[3] if op == "conv2d_backprop_input" else layer.filter_shape[3]


def pattern_rows(layer: Layer, op: str) -> tuple[int, str]:
    """(test rows one call carries when read at the spot, '' or why this op cannot carry
    them there). Read at chosen GEMM rows (`pattern_outputs`' `rows`), any op carries
    `pattern_columns`."""
    if op == "conv2d_backprop_input" and layer.strides != (1, 1):
        return 0, "a strided input gradient's dx pixels each read one phase of the taps: read by GEMM row only"
    if spot(layer, op) is None:
        return 0, "no output of this layer reads only in-bounds inputs: not measured"
    return pattern_columns(layer, op), ""


def partial_window(layer: Layer, op: str) -> tuple[np.ndarray, tuple[int, int]] | None:
    """For a forward conv none of whose outputs reads only in-bounds inputs: the K positions
    (taps, channels) that the output reading the most of them reads, and where that output
    is; None for a layer with such an output, and for the gradients."""
    if op != "conv2d" or spot(layer, op) is not None:
        return None
    leaves, rows = row_groups(layer, op)[0]
    _, oh, ow = np.unravel_index(int(rows[0]), layer.output_shape[:3])
    return leaves, (int(oh), int(ow))


def pattern_outputs(backend, layer: Layer, op: str, patterns: np.ndarray, scale: float,
                    rows: np.ndarray | None = None, window: tuple[np.ndarray, tuple[int, int]] | None = None
                    ) -> np.ndarray:
    """sum_k patterns[r, k] for each row r, computed by `op` at `layer`'s shape (see module
    docstring); rows beyond one call's capacity take several calls, run together. With
    `rows` (GEMM row indices), each pattern's sum as every one of those GEMM rows computes
    it: (patterns, rows). With `window` (`partial_window`), the patterns are over its K
    positions and read at its output."""
    if window is not None:
        leaves, (ph, pw) = window
        capacity = layer.filter_shape[3]
        spread = np.zeros((len(patterns), layer.k(op)), dtype=np.asarray(patterns).dtype)
        spread[:, leaves] = patterns
        patterns = spread
    elif rows is not None:
        capacity = pattern_columns(layer, op)
    else:
        capacity, why = pattern_rows(layer, op)
        if not capacity:
            raise ValueError(why)
        where = spot(layer, op)
        assert where is not None  # (`pattern_rows` carries no rows without a spot)
        ph, pw = where
    (kh, kw, cg, cout), groups = layer.filter_shape, layer.groups
    constant = {"conv2d": layer.input_shape, "conv2d_backprop_input": layer.output_shape,
                "conv2d_backprop_filter": layer.input_shape}[op]
    filled = np.full(constant, scale, np.float16)
    operands = []
    for values in blocks(patterns, capacity, scale):
        if op == "conv2d":  # taps (i, j, c) in order
            operands.append((filled, np.ascontiguousarray(values.T).reshape(layer.filter_shape)))
        elif op == "conv2d_backprop_input":  # taps (i, j, o) of the 180-degree rotated filter, in order
            # dx channel (group g, channel i of it) reads w[..., i, g's output channels]
            w = (values.reshape(groups, cg, kh, kw, cout // groups)[:, :, ::-1, ::-1, :]
                 .transpose(2, 3, 1, 0, 4).reshape(kh, kw, cg, cout))
            operands.append((filled, np.ascontiguousarray(w)))
        else:  # positions (n, oh, ow) of the batch, in order
            operands.append((filled, np.ascontiguousarray(values.T).reshape(layer.output_shape)))
    outputs = run_ops(backend, layer, op, operands)
    if rows is not None:  # the GEMM: (rows, columns) of each call's output
        read = [y.reshape(-1, capacity)[rows].T for y in outputs]
        return np.concatenate(read).astype(np.float64)[:len(patterns)]
    read = [y[0, ph, pw] if op != "conv2d_backprop_filter" else y[ph, pw, 0] for y in outputs]
    return np.concatenate(read).astype(np.float64)[:len(patterns)]


def _layout_specs(layer: Layer, op: str, columns=()) -> tuple[str, ...]:
    """An input gradient's K runs tap by tap over C_out output channels: the one-tap chunks
    that the measured stride-1 layers show (fp16 and fp32 accumulators), which a strided
    layer (its crafted rows kept out) can only try. Where every (tap, channel) column of a
    strided layer shares one kernel (`columns`: one run), that kernel's model is tried over
    the whole K, zeros included (XLA's conv of the dilated dy), and tap by tap, the taps
    added in its accumulator (col2im)."""
    if op != "conv2d_backprop_input":
        return ()
    n = layer.filter_shape[3]
    models: list[AccumulationModel] = [Chunked("fp16", chunk=n, product="fp16", total="fp16"),
                                       Chunked("fp32", chunk=n, total="fp32", output="fp16")]
    if len(columns) == 1:
        kernel = columns[0].structure
        models += candidate_models(kernel, layer.k(op))
        tap = column_model(kernel, n)
        if tap and kernel.accumulator in ("fp16", "fp32"):
            models.append(SplitK(kernel.accumulator, inner=tap, length=n))
    return tuple(dict.fromkeys(model.to_spec() for model in models))


def measure(backend, layer: Layer, op: str, seed: int = 0) -> Structure:
    """The structure of `op` at `layer` (see the module docstring); never raises for a
    layer it cannot measure - the Structure's note says why. `seed` picks the tiles'
    random patterns. A filter gradient over several images and positions is measured in
    both orders of its positions (`batch_order`), a stride-1 input gradient as col2im and
    as the forward conv of dy with the rotated filter (`input_gradient_layout`)."""
    measured = _measure_in_order(backend, layer, op, seed)
    if op == "conv2d_backprop_input":
        forward = forward_layer(layer)
        if forward is None:
            return measured
        as_forward = _measure_in_order(AsForward(backend, layer), forward, "conv2d", seed)
        return replace(measured, as_forward=as_forward.to_dict())
    n, oh, ow, _ = layer.output_shape
    if op != "conv2d_backprop_filter" or n < 2 or oh * ow < 2:
        return measured
    innermost = _measure_in_order(BatchInnermost(backend), layer, op, seed, window_probe=False)
    return replace(measured, batch_innermost=_batch_innermost(backend, layer, measured),
                   innermost=innermost.to_dict())


class _Tiles(TypedDict):
    """The `Structure` fields `tile_patterns.measure_tiles` fills."""

    columns: list[dict] | None
    columns_note: str
    rows: list[dict] | None
    rows_note: str


def _measure_in_order(backend, layer: Layer, op: str, seed: int, window_probe: bool = True) -> Structure:
    """Tiles and crafted rows of `op` at `layer`, in the order `backend` lays rows out."""
    tiling = measure_tiles(backend, layer, op, _spot_row(layer, op), seed, window_probe)
    tiles: _Tiles = {"columns": [run.to_dict() for run in tiling.columns] or None, "columns_note": tiling.columns_note,
             "rows": [run.to_dict() for run in tiling.rows] or None, "rows_note": tiling.rows_note}
    capacity, why = pattern_rows(layer, op)
    window = partial_window(layer, op)
    if window is not None:
        on_window = measure_rows(lambda patterns, scale: pattern_outputs(backend, layer, op, patterns, scale,
                                                                         window=window), len(window[0]))
        full = on_full_k(on_window, window)
        return replace(full, derived=(*_layout_specs(layer, op), *_window_specs(full, window, layer.k(op))), **tiles)
    if not capacity:
        return Structure(note=why, derived=_layout_specs(layer, op, tiling.columns), **tiles)
    runs = tiling.columns
    if len(runs) == 1 and column_k(layer, op) == layer.k(op):  # one kernel, measured on the whole K already
        measured = runs[0].structure
    else:
        measured = measure_rows(lambda patterns, scale: pattern_outputs(backend, layer, op, patterns, scale),
                                layer.k(op))
    return replace(measured, derived=_layout_specs(layer, op), **tiles)


def on_full_k(measured: Structure, window: tuple[np.ndarray, tuple[int, int]]) -> Structure:
    """A structure measured on a window's K positions (`partial_window`), in K positions:
    a partial sum that starts at the window's i-th position starts at that K position (where
    a run of padded taps lies before it, the start may lie anywhere in the run: the first
    in-bounds position is taken, and the confirmation decides). Lanes keep their meaning
    only where every run of in-bounds positions starts and ends on a lane boundary."""
    leaves, (oh, ow) = window
    where = f"measured on the {len(leaves)} in-bounds terms of output ({oh}, {ow}), the most any output reads"
    note = "; ".join(part for part in (measured.note, where) if part)
    runs = np.split(leaves, np.flatnonzero(np.diff(leaves) != 1) + 1)
    lanes = measured.lanes
    if lanes and lanes > 1 and any(run[0] % lanes or len(run) % lanes for run in runs):
        return replace(measured, lanes=None, note=f"{note}; {lanes} lanes over in-bounds runs that do not "
                                                  f"align with them: not mapped")
    bounds = None if measured.boundaries is None else [int(leaves[b]) for b in measured.boundaries if 0 < b < len(leaves)]
    return replace(measured, boundaries=bounds, note=note)


def _window_specs(measured: Structure, window, k: int) -> list[str]:
    """Readings of an fp16 kernel's starts that a window cannot tell apart. From B at its
    start, a kernel split once (K sharded over two threads) reads like chunks every n added
    in fp32 (`structure._fp16_structure` then takes every n as a start, counted from the
    window's first term): the single split is tried, and chunks every n counted from K's
    first term where the window starts on one."""
    if measured.accumulator != "fp16" or measured.total != "fp32" or not measured.boundaries:
        return []
    first, start = measured.boundaries[0], int(window[0][0])
    specs = candidate_specs(replace(measured, boundaries=[first], total="fp16"), k)
    period = first - start
    if period > 0 and start % period == 0:
        specs += candidate_specs(replace(measured, boundaries=list(range(period, k, period))), k)
    return list(dict.fromkeys(specs))


def _spot_row(layer: Layer, op: str) -> int | None:
    """The GEMM row `pattern_outputs` reads (image 0; the filter gradient's spot tap, channel
    0); None for the input gradient (its dx pixel sums many rows) or where there is no spot."""
    where = spot(layer, op)
    if where is None or op == "conv2d_backprop_input":
        return None
    if op == "conv2d":
        return where[0] * layer.output_shape[2] + where[1]
    return (where[0] * layer.filter_shape[1] + where[1]) * layer.filter_shape[2]


def _batch_innermost(backend, layer: Layer, measured: Structure) -> bool | None:
    """Whether a filter gradient sums its positions with the batch innermost, (oh, ow, n):
    B at (n, oh, ow) = (0, 0, 0), a unit at (1, 0, 0) and -B at (0, 0, 1). Image by image
    -B cancels B before the unit comes (the unit is the sum); batch innermost the unit
    meets B first and ties back to it (0). None where the order cannot show (one image,
    one column), the accumulator is not fp16 or fp32, or the sum is not one chain (lanes
    would part B from -B; a backward sum reads the row mirrored)."""
    n, oh, ow, _ = layer.output_shape
    probes: dict[str | None, Probe] = {"fp16": FP16_PROBE, "fp32": FP32_PROBE}
    probe = probes.get(measured.accumulator)
    if n < 2 or ow < 2 or probe is None or measured.lanes != 1 or measured.backwards:
        return None
    row = np.zeros((1, layer.k("conv2d_backprop_filter")))
    row[0, 0], row[0, oh * ow], row[0, 1] = probe.big, probe.unit, -probe.big
    with np.errstate(over="ignore", invalid="ignore"):
        got = float(pattern_outputs(backend, layer, "conv2d_backprop_filter", row, 1.0)[0])
    return {probe.unit: False, 0.0: True}.get(got)
