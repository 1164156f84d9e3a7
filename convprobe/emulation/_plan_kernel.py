"""The one kernel that runs every program of `plan`: a tile of GEMM rows at a time (or of
dot products, `run_pairs`), each step one vector loop over the tile's outputs in float32
lanes (why that is exact: `plan`).

Step codes are `plan.Op`'s; flags: `HALF` (the step rounds to fp16, else fp32), `ADD32`
(an fp16 step whose sum is rounded to fp32 first) and `PRODUCT16` (the step's product is
rounded to fp16 first). The loops are written once
(`_add_product`, `_add_register`) and called with constant flags, so each branch compiles
to its own straight vector loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import add_odd32, narrow, widen
from convprobe.emulation._threads import over_tasks

__all__ = ["HALF", "ADD32", "PRODUCT16", "ZERO", "LOAD", "ADD_LEAF", "ADD", "ROUND", "MOVE", "run_pairs",
           "run_program"]

HALF = 1
ADD32 = 2
PRODUCT16 = 4
ZERO, LOAD, ADD_LEAF, ADD, ROUND, MOVE = 0, 1, 2, 3, 4, 5  # step codes (`plan.Op`)
TILE_ROWS = _ROWS = 8  # GEMM rows per tile: each step's loop covers 8 rows by every column
_LANES = 64  # dot products per pair tile: each step's loop covers 64 of them
NARROW = 8  # fewer GEMM columns than this: rows in lanes (a step's loop over the columns is too short)


@njit(cache=True, inline="always")
def _fp16(x):
    return widen(narrow(x))


@njit(cache=True, inline="always")
def _rounded(s, v, half, add32):
    """s + v rounded once to fp16 (`half`) or fp32; `add32`: to fp32, then fp16."""
    if not half:
        return s + v
    if add32:
        return _fp16(s + v)
    return _fp16(add_odd32(s, v))


@njit(cache=True, inline="always")
def _add_product(regs, r, a, w, m0, rows, k, pairs, product_fp16, half, add32):
    """GEMM tiles: product (i, n) is a[m0 + i, k] * w[k, n]; pair tiles (`pairs`, one row of
    lanes): a[k, n] * w[k, n], both operands transposed into the tile."""
    for i in range(rows):
        for n in range(w.shape[1]):
            p = a[k, n] * w[k, n] if pairs else a[m0 + i, k] * w[k, n]
            if product_fp16:
                p = _fp16(p)
            regs[r, i, n] = _rounded(regs[r, i, n], p, half, add32)


@njit(cache=True, inline="always")
def _add_product_rounded(regs, r, a, w, m0, rows, k, pairs, product_fp16, half, add32):
    """`_add_product` with the step's format as constants (one vector loop per branch)."""
    if not half:
        _add_product(regs, r, a, w, m0, rows, k, pairs, product_fp16, False, False)
    elif add32:
        _add_product(regs, r, a, w, m0, rows, k, pairs, product_fp16, True, True)
    else:
        _add_product(regs, r, a, w, m0, rows, k, pairs, product_fp16, True, False)


@njit(cache=True, inline="always")
def _add_register(regs, r, s, rows, half, add32):
    for i in range(rows):
        for n in range(regs.shape[2]):
            regs[r, i, n] = _rounded(regs[r, i, n], regs[s, i, n], half, add32)


@njit(cache=True, inline="always")
def _run_steps(regs, steps, a, w, m0, rows, pairs):
    """Every step of the program on one tile (registers regs[:, :rows])."""
    for j in range(steps.shape[0]):
        op, r, x, flags = steps[j, 0], steps[j, 1], steps[j, 2], steps[j, 3]
        half, add32, product_fp16 = (flags & HALF) != 0, (flags & ADD32) != 0, (flags & PRODUCT16) != 0
        if op == ADD_LEAF:
            if product_fp16:
                _add_product_rounded(regs, r, a, w, m0, rows, x, pairs, True, half, add32)
            else:
                _add_product_rounded(regs, r, a, w, m0, rows, x, pairs, False, half, add32)
        elif op == ADD:
            if not half:
                _add_register(regs, r, x, rows, False, False)
            elif add32:
                _add_register(regs, r, x, rows, True, True)
            else:
                _add_register(regs, r, x, rows, True, False)
        elif op == ZERO:
            regs[r, :rows, :] = 0.0
        elif op == MOVE:
            regs[r, :rows, :] = regs[x, :rows, :]
        elif op == LOAD:
            for i in range(rows):
                for n in range(w.shape[1]):
                    p = a[x, n] * w[x, n] if pairs else a[m0 + i, x] * w[x, n]
                    regs[r, i, n] = _fp16(p) if product_fp16 else p
        elif half:  # ROUND to fp16 (to fp32: the values are float32 numbers already)
            for i in range(rows):
                for n in range(regs.shape[2]):
                    regs[r, i, n] = _fp16(regs[r, i, n])


@njit(cache=True, nogil=True)
def _gemm_tiles(t0, t1, a, w, steps, registers, out, col0):
    """Tiles t0 .. t1 - 1 (`_ROWS` GEMM rows by every column) of `run_program`."""
    m_count, n_count = a.shape[0], w.shape[1]
    regs = np.zeros((registers, _ROWS, n_count), np.float32)
    for t in range(t0, t1):
        m0 = t * _ROWS
        rows = min(_ROWS, m_count - m0)
        _run_steps(regs, steps, a, w, m0, rows, False)
        for i in range(rows):
            for n in range(n_count):
                out[m0 + i, col0 + n] = regs[0, i, n]


@njit(cache=True, nogil=True)
def _pair_tiles(t0, t1, a, b, steps, registers, out):
    """Tiles t0 .. t1 - 1 (`_LANES` rows each, transposed into lanes) of `run_pairs`."""
    m_count, k_count = a.shape
    regs = np.zeros((registers, 1, _LANES), np.float32)
    at = np.zeros((k_count, _LANES), np.float32)
    bt = np.zeros((k_count, _LANES), np.float32)
    for t in range(t0, t1):
        m0 = t * _LANES
        rows = min(_LANES, m_count - m0)
        for i in range(rows):
            for k in range(k_count):
                at[k, i] = widen(a[m0 + i, k])
                bt[k, i] = widen(b[m0 + i, k])
        _run_steps(regs, steps, at, bt, 0, 1, True)
        for i in range(rows):
            out[m0 + i] = regs[0, 0, i]


@njit(cache=True, nogil=True)
def _narrow_tiles(t0, t1, a, w, steps, registers, out, col0):
    """Tiles t0 .. t1 - 1 of `run_program` for a few columns: `_LANES` GEMM rows transposed
    into lanes, then each column as pair tiles against that column of w, broadcast."""
    m_count, k_count = a.shape
    regs = np.zeros((registers, 1, _LANES), np.float32)
    at = np.zeros((k_count, _LANES), np.float32)
    wt = np.zeros((k_count, _LANES), np.float32)
    for t in range(t0, t1):
        m0 = t * _LANES
        rows = min(_LANES, m_count - m0)
        for i in range(rows):
            for k in range(k_count):
                at[k, i] = a[m0 + i, k]
        for n in range(w.shape[1]):
            for k in range(k_count):
                wt[k, :] = w[k, n]
            _run_steps(regs, steps, at, wt, 0, 1, True)
            for i in range(rows):
                out[m0 + i, col0 + n] = regs[0, 0, i]


def run_program(a, w, steps, registers, out, col0):
    """out[:, col0:col0 + N] = the program's sums (register 0) of a (M, K) against w (K, N),
    float32: tiles of GEMM rows by every column, or for fewer than `NARROW` columns, rows in
    lanes column by column."""
    if w.shape[1] < NARROW:
        over_tasks(_narrow_tiles, a.shape[0], a, w, steps, registers, out, col0, per_task=_LANES)
    else:
        over_tasks(_gemm_tiles, a.shape[0], a, w, steps, registers, out, col0, per_task=_ROWS)


def run_pairs(a, b, steps, registers, out):
    """out[m] = the program's sum of a[m, :] * b[m, :] (a, b (M, K) fp16 bit patterns, uint16;
    out (M,) float32)."""
    over_tasks(_pair_tiles, a.shape[0], a, b, steps, registers, out, per_task=_LANES)
