"""The one kernel that runs every program of `plan`: a tile of GEMM rows at a time (or of
dot products, `run_pairs`), each step one vector loop per output channel over the tile's
rows in float32 lanes (why that is exact: `plan`).

Step codes are `plan.Op`'s; flags: `HALF` (the step rounds to fp16, else fp32), `ADD32`
(an fp16 step whose sum is rounded to fp32 first), `PRODUCT16` (the step's product is
rounded to fp16 first) and `FMA16` (an exact fp16 step onto a register that holds an fp16
value: the CPU's fp16 fused multiply-add, where the kernel runs it). The loops are written
once (`_add_product`, `_add_register`) and called with constant flags, so each branch
compiles to its own straight vector loop.

Layout: a tile is `LANES` GEMM rows, transposed into lanes, by a block of up to
`CHANNELS` output channels; a register holds one value per (channel, row), and a step's
loop runs over the 64 rows of a channel (four 512-bit vectors) with the channel's weight
broadcast. Rows in lanes keep each loop long whatever the layer's channel count (16 in
ResNet-20's first stage: one vector, where loops over channels paid their set-up for each
vector), and the weights, transposed once, are read as scalars.

The fp16 FMA (`vfmadd231ph`, AVX512-FP16) computes fp16(s + a * w) with one rounding,
exactly the exact fp16 step, where s, a and w are fp16 values; `plan` marks the steps where
s is one. It runs in its own compiled kernel (`fma16=True`), chosen only where the CPU has
the instruction (elsewhere LLVM would widen it and round twice: `_native_fp16`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import add_odd32, load_tile, narrow, prefer_512_bit_vectors, widen
from convprobe.emulation._native_fp16 import fma_fp16
from convprobe.emulation._threads import over_tasks

__all__ = ["HALF", "ADD32", "PRODUCT16", "FMA16", "ZERO", "LOAD", "ADD_LEAF", "ADD", "ROUND", "MOVE", "LANES",
           "CHANNELS", "run_pairs", "run_program"]

HALF = 1
ADD32 = 2
PRODUCT16 = 4
FMA16 = 8
ZERO, LOAD, ADD_LEAF, ADD, ROUND, MOVE = 0, 1, 2, 3, 4, 5  # step codes (`plan.Op`)
LANES = 64  # GEMM rows (or dot products) per tile, in lanes
CHANNELS = 16  # output channels per block of a tile (a register: 4 KiB, a dozen of them fit the L1 cache)


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
def _product(first, tile, c0, c, k, i, pairs):
    """Product (c, i) of a step's leaf k: GEMM tiles, first[c0 + c, k] * tile[k, i] (first:
    the weights transposed, tile: the tile's GEMM rows transposed); pair tiles (`pairs`, one
    channel): first[k, i] * tile[k, i], both operands transposed into lanes."""
    return (first[k, i] if pairs else first[c0 + c, k]) * tile[k, i]


@njit(cache=True, inline="always")
def _add_product(regs, r, first, tile, c0, channels, k, pairs, product_fp16, half, add32, fused):
    """regs[r] = round(regs[r] + product k) over the tile (`_product`); `fused`: fp16(s + a * w)
    by the fp16 FMA, on the product's operands."""
    for c in range(channels):
        for i in range(tile.shape[1]):
            if fused:
                x = first[k, i] if pairs else first[c0 + c, k]
                regs[r, c, i] = widen(fma_fp16(narrow(x), narrow(tile[k, i]), narrow(regs[r, c, i])))
            else:
                p = _product(first, tile, c0, c, k, i, pairs)
                if product_fp16:
                    p = _fp16(p)
                regs[r, c, i] = _rounded(regs[r, c, i], p, half, add32)


@njit(cache=True, inline="always")
def _add_product_rounded(regs, r, first, tile, c0, channels, k, pairs, product_fp16, half, add32):
    """`_add_product` with the step's format as constants (one vector loop per branch)."""
    if not half:
        _add_product(regs, r, first, tile, c0, channels, k, pairs, product_fp16, False, False, False)
    elif add32:
        _add_product(regs, r, first, tile, c0, channels, k, pairs, product_fp16, True, True, False)
    else:
        _add_product(regs, r, first, tile, c0, channels, k, pairs, product_fp16, True, False, False)


@njit(cache=True, inline="always")
def _add_register(regs, r, s, channels, half, add32):
    for c in range(channels):
        for i in range(regs.shape[2]):
            regs[r, c, i] = _rounded(regs[r, c, i], regs[s, c, i], half, add32)


@njit(cache=True, inline="always")
def _run_steps(regs, steps, first, tile, c0, channels, pairs, fma16):
    """Every step of the program on one tile (registers regs[:, :channels]; operands as
    `_product` reads them); `fma16`: steps marked `FMA16` run the fp16 FMA."""
    for j in range(steps.shape[0]):
        op, r, x, flags = steps[j, 0], steps[j, 1], steps[j, 2], steps[j, 3]
        half, add32, product_fp16 = (flags & HALF) != 0, (flags & ADD32) != 0, (flags & PRODUCT16) != 0
        if op == ADD_LEAF:
            if fma16 and (flags & FMA16) != 0:
                _add_product(regs, r, first, tile, c0, channels, x, pairs, False, True, False, True)
            elif product_fp16:
                _add_product_rounded(regs, r, first, tile, c0, channels, x, pairs, True, half, add32)
            else:
                _add_product_rounded(regs, r, first, tile, c0, channels, x, pairs, False, half, add32)
        elif op == ADD:
            if not half:
                _add_register(regs, r, x, channels, False, False)
            elif add32:
                _add_register(regs, r, x, channels, True, True)
            else:
                _add_register(regs, r, x, channels, True, False)
        elif op == ZERO:
            regs[r, :channels, :] = 0.0
        elif op == MOVE:
            regs[r, :channels, :] = regs[x, :channels, :]
        elif op == LOAD:
            for c in range(channels):
                for i in range(tile.shape[1]):
                    p = _product(first, tile, c0, c, x, i, pairs)
                    regs[r, c, i] = _fp16(p) if product_fp16 else p
        elif half:  # ROUND to fp16 (to fp32: the values are float32 numbers already)
            for c in range(channels):
                for i in range(regs.shape[2]):
                    regs[r, c, i] = _fp16(regs[r, c, i])


@njit(cache=True, inline="always")
def _gemm_tiles(t0, t1, a, wt, steps, registers, out, col0, fma16):
    """Tiles t0 .. t1 - 1 of `run_program`: `LANES` rows of a transposed into lanes, by each
    block of `CHANNELS` columns (rows of wt, w transposed)."""
    m_count, k_count = a.shape
    n_count = wt.shape[0]
    regs = np.zeros((registers, min(CHANNELS, n_count), LANES), np.float32)
    tile = np.zeros((k_count, LANES), np.float32)
    for t in range(t0, t1):
        m0 = t * LANES
        rows = min(LANES, m_count - m0)
        load_tile(a, m0, rows, tile)
        for c0 in range(0, n_count, CHANNELS):
            channels = min(CHANNELS, n_count - c0)
            _run_steps(regs, steps, wt, tile, c0, channels, False, fma16)
            for c in range(channels):
                for i in range(rows):
                    out[m0 + i, col0 + c0 + c] = regs[0, c, i]


@njit(cache=True, nogil=True)
def _gemm_tiles_f32(t0, t1, a, wt, steps, registers, out, col0):
    prefer_512_bit_vectors()
    _gemm_tiles(t0, t1, a, wt, steps, registers, out, col0, False)


@njit(cache=True, nogil=True)
def _gemm_tiles_fma16(t0, t1, a, wt, steps, registers, out, col0):
    prefer_512_bit_vectors()
    _gemm_tiles(t0, t1, a, wt, steps, registers, out, col0, True)


@njit(cache=True, inline="always")
def _pair_tiles(t0, t1, a, b, steps, registers, out, fma16):
    """Tiles t0 .. t1 - 1 (`LANES` rows each, transposed into lanes) of `run_pairs`."""
    m_count, k_count = a.shape
    regs = np.zeros((registers, 1, LANES), np.float32)
    at = np.zeros((k_count, LANES), np.float32)
    bt = np.zeros((k_count, LANES), np.float32)
    for t in range(t0, t1):
        m0 = t * LANES
        rows = min(LANES, m_count - m0)
        load_tile(a, m0, rows, at)
        load_tile(b, m0, rows, bt)
        _run_steps(regs, steps, at, bt, 0, 1, True, fma16)
        for i in range(rows):
            out[m0 + i] = regs[0, 0, i]


@njit(cache=True, nogil=True)
def _pair_tiles_f32(t0, t1, a, b, steps, registers, out):
    prefer_512_bit_vectors()
    _pair_tiles(t0, t1, a, b, steps, registers, out, False)


@njit(cache=True, nogil=True)
def _pair_tiles_fma16(t0, t1, a, b, steps, registers, out):
    prefer_512_bit_vectors()
    _pair_tiles(t0, t1, a, b, steps, registers, out, True)


def run_program(a, w, steps, registers, out, col0, fma16):
    """out[:, col0:col0 + N] = the program's sums (register 0) of a (M, K) against w (K, N),
    float32; `fma16`: `FMA16` steps by the CPU's fp16 FMA (the caller checks it has one)."""
    kernel = _gemm_tiles_fma16 if fma16 else _gemm_tiles_f32
    over_tasks(kernel, a.shape[0], a, np.ascontiguousarray(w.T), steps, registers, out, col0, per_task=LANES)


def run_pairs(a, b, steps, registers, out, fma16):
    """out[m] = the program's sum of a[m, :] * b[m, :] (a, b (M, K) fp16 bit patterns, uint16;
    out (M,) float32)."""
    over_tasks(_pair_tiles_fma16 if fma16 else _pair_tiles_f32, a.shape[0], a, b, steps, registers, out,
               per_task=LANES)
