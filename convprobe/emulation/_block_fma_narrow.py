"""The block-FMA kernel in 32-bit lanes: fp16 and fp8 inputs, accumulators up to fp32.

Same definition as `_block_fma` (NumPy) and `_block_fma_compiled` (float64 lanes), which
this kernel is tested against bit for bit; it holds every value in float32 or int32, so
a vector carries twice as many outputs as the float64 kernel's. Why that is exact, under
the conditions `applies` checks from the formats:

* The product of two fp16 (or fp8) inputs has at most 22 significand bits and lies in
  float32's normal range, so it is a float32 number; scaling it by the block's
  2**(p - 1 - E) (a power of two built from its bits, p the adder's precision with its
  extra bits, E the alignment exponent) is exact, or gives a value below 1 that
  truncates to 0 either way. The conversion to int32 is the truncation.
* Each truncated term is an integer below 2**(p + 1), so a block's b terms sum in int32.
* The running sum is a value of the accumulator (at most 24 bits, inside float32's
  range), so it is a float32 number.
* The block's total (the truncated running sum plus the terms) is rounded once: in
  int32 to the block format where it fits (`fused`: blocks of 4 or 8 into fp32 with
  every sum normal - v100, a100 - or into fp16 with its subnormals and overflow; one pass
  per block), else in float64 by the one rounding routine's twins (`round_normal`,
  `fast_round`).

Rows of inputs with an inf or NaN, an accumulator input and wider formats go to the
float64 kernel of `_block_fma_compiled` (whose `gemm` dispatches); `dot`'s rows (`rows`)
with an inf or NaN, to NumPy's `reduce_rows` (`_block_fma.dot_rows`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import (NEAREST_EVEN, TOWARD_ZERO, add_odd, bitlen32, f2i32, i2f, i2f32,
                                                    load_tile, prefer_512_bit_vectors)
from convprobe.emulation._kernels_fast import fast_round, round_normal
from convprobe.emulation._threads import over_tasks
from convprobe.formats import FP16, FP32
from convprobe.options import CAddition

__all__ = ["applies", "fused", "gemm", "rows"]

TILE = 256  # rows per task: 16 vectors of 16 lanes, independent chains through each block's pass
CHANNELS = 16  # output channels whose running sums take each block of the tile's rows in turn
_NONE = -(1 << 28)  # the exponent of a zero addend, below every other; sums of two fit int32
_LIVE = _NONE // 2  # an alignment exponent above this has a nonzero term or running sum
# the fused pass's block formats (every integer here an int32: see below)
_FP32_BITS, _FP32_EMIN = np.int32(FP32.precision), np.int32(FP32.emin)
_FP16_BITS, _FP16_EMIN, _FP16_MAX = np.int32(FP16.precision), np.int32(FP16.emin), np.float32(FP16.max)
# (Every integer below is an int32: one int64 operand - a Python int, a run-time argument -
# widens the whole lane to 64 bits, which halved the fused fp16 pass's speed.)
_I0, _I1, _I30 = np.int32(0), np.int32(1), np.int32(30)
_SIGN, _INF_BITS = np.int32(-(1 << 31)), np.int32(0x7F800000)


def applies(model) -> bool:
    """Whether `gemm` computes `model` (finite inputs, from +0), for a model the compiled
    kernel computes (`_block_fma_compiled.applies`, which its callers check first: exact
    products, input-exponent alignment, truncation): products of two inputs
    are float32 numbers; every scale 2**(p - 1 - E) is a normal float32 (E is at least
    the smallest quantum's exponent 2 * emin - p + 1, at most 128: an infinite running
    sum); b terms, each below 2**(p + 1), sum in int32; the accumulator's and block
    format's values are float32 numbers."""
    fin, adder_p = model.input, model.adder.precision + model.extra_bits
    products = 2 * fin.precision <= 24 and 2 * (fin.emin - fin.precision + 1) >= -126 and 2 * fin.emax + 2 < 128
    scales = 2 * adder_p - 2 - 2 * fin.emin <= 127 and adder_p - 129 >= -126
    return (products and scales and FP32.holds(model.accumulator)
            and FP32.holds(model.block_format) and model.b << (adder_p + 1) <= 1 << 31)


def fused(model, normal: bool) -> int:
    """Whether a block is one int32 pass (0: no; 1: into fp32; 2: into fp16): blocks of 4
    or 8, the truncated running sum plus b terms (each below 2**(p + 1)), rounded up once
    more, below 2**30; the block format fp32 with every sum normal, or fp16 (the
    accumulator's too) keeping subnormals and overflowing to inf."""
    adder_p = model.adder.precision + model.extra_bits
    fmt = model.block_format
    bound = (model.b + 1) << (adder_p + 1)
    if not (model.b in (4, 8) and model.step % model.b == 0 and bound <= 1 << 30):
        return 0
    if normal and (fmt.precision, fmt.emin) == (FP32.precision, FP32.emin):
        return 1
    fp16 = (fmt.precision, fmt.emin, fmt.max, fmt.has_inf) == (FP16.precision, FP16.emin, FP16.max, True)
    keeps = model.subnormals == "keep" and model.overflow == "inf" and model.accumulator == fmt
    return 2 if fp16 and keeps else 0


@njit(cache=True, inline="always")
def _exponent(x, emin):
    """floor(log2|x|) of a finite float32 clamped at emin; _NONE for 0. An infinite
    running sum gives 128 (its blocks keep it: see `_finish`)."""
    e = np.int32(np.int32((f2i32(x) >> np.int32(23)) & np.int32(0xFF)) - np.int32(127))
    return np.int32(_NONE) if x == 0 else max(e, np.int32(emin))


@njit(cache=True, inline="always")
def _pow2(e):
    """2**e as float32 for -126 <= e <= 127, from its bits."""
    return i2f32(np.int32(np.int32(e + np.int32(127)) << np.int32(23)))


@njit(cache=True, inline="always")
def _term(a, w, sc):
    """One product, scaled and truncated: exact (see the module docstring)."""
    return np.int32(a * w * sc)


@njit(cache=True, inline="always")
def _round_int(tv, bp, low, mode):
    """The integer tv rounded to bp significant bits, and at least to 2**low (a format's
    subnormal quantum), nearest-even or toward zero, as a float32; exact for |tv| < 2**30.
    The shift stays below 30: `low` is at most p + 3 (the smallest alignment exponent is
    2 * (-14) for fp16 inputs), and the clamp only keeps the shifts defined."""
    neg = tv < 0
    m = np.int32(-tv) if neg else np.int32(tv)
    sh = np.int32(min(max(max(np.int32(bitlen32(m) - np.int32(bp)), np.int32(low)), _I0), _I30))
    if mode == NEAREST_EVEN:
        up = np.int32(np.int32(np.int32((_I1 << sh) >> _I1) - _I1) + np.int32((m >> sh) & _I1))
        m = np.int32(m + (up if sh > _I0 else _I0))
    m = np.int32(m & ~np.int32((_I1 << sh) - _I1))
    f = np.float32(m)
    return -f if neg else f


@njit(cache=True, inline="always")
def _round_int24(tv, mode):
    """`_round_int(tv, 24, -64, mode)` by the conversion to float32 (|tv| < 2**30): it rounds
    to 24 bits, nearest even (MXCSR's default); toward zero, a result above tv in magnitude
    (converted back: exact) steps one ulp down (from a power of two, to the largest float32
    below it, which is then the truncation)."""
    f = np.float32(tv)
    if mode == TOWARD_ZERO:
        back = np.int32(f)
        over = abs(back) > abs(tv)
        f = i2f32(np.int32(f2i32(f) - np.int32(1))) if over else f
    return f


@njit(cache=True, inline="always")
def _block_fused(s, at, et, j, ew, w, width, adder_p, mode, fp16):
    """A whole block of 4 or 8 terms in one int32 pass over the tile: alignment, the
    truncated sum, the rounding to the block format (`fused`): fp32, where every sum is
    normal, or fp16 (`fp16`), with its subnormal quantum, overflow to inf, and an infinite
    running sum kept. Width, mode and format are constants (as run-time values they stop
    the pass vectorising, 2.4x slower; an int64 anywhere widens its lanes: 2x for fp16)."""
    bits, emin = (_FP16_BITS, _FP16_EMIN) if fp16 else (_FP32_BITS, _FP32_EMIN)
    adder_p = np.int32(adder_p)
    e0, e1, e2, e3 = ew[0], ew[1], ew[2], ew[3]
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    if width == 8:
        e4, e5, e6, e7 = ew[4], ew[5], ew[6], ew[7]
        w4, w5, w6, w7 = w[4], w[5], w[6], w[7]
    else:
        e4 = e5 = e6 = e7 = np.int32(_NONE)
        w4 = w5 = w6 = w7 = np.float32(0.0)
    for i in range(TILE):
        sv = s[i]
        top = np.int32(max(max(_exponent(sv, emin), np.int32(et[j, i] + e0)),
                           max(np.int32(et[j + 1, i] + e1),
                               max(np.int32(et[j + 2, i] + e2), np.int32(et[j + 3, i] + e3)))))
        if width == 8:
            top = np.int32(max(max(top, np.int32(et[j + 4, i] + e4)),
                               max(np.int32(et[j + 5, i] + e5),
                                   max(np.int32(et[j + 6, i] + e6), np.int32(et[j + 7, i] + e7)))))
        live = top > _LIVE
        sc = _pow2(np.int32(np.int32(adder_p - _I1) - top)) if live else np.float32(0.0)
        tv = np.int32(np.int32(np.int32(sv * sc) + _term(at[j, i], w0, sc))
                      + np.int32(_term(at[j + 1, i], w1, sc) + np.int32(_term(at[j + 2, i], w2, sc)
                                                                         + _term(at[j + 3, i], w3, sc))))
        if width == 8:
            tv = np.int32(tv + np.int32(np.int32(_term(at[j + 4, i], w4, sc) + _term(at[j + 5, i], w5, sc))
                                        + np.int32(_term(at[j + 6, i], w6, sc)
                                                   + _term(at[j + 7, i], w7, sc))))
        q = np.int32(np.int32(top - adder_p) + _I1)  # the weight of tv's unit
        low = np.int32(np.int32(np.int32(emin - bits) + _I1) - q) if fp16 else np.int32(-64)
        value = (_round_int(tv, bits, low, mode) if fp16 else _round_int24(tv, mode)) * _pow2(q)
        if fp16:  # overflow: inf of value's sign
            value = i2f32(np.int32(f2i32(value) & _SIGN) | _INF_BITS) if abs(value) > _FP16_MAX else value
            live &= math.isfinite(sv)
        s[i] = value if live else sv  # an exact zero sum is +0


@njit(cache=True, inline="always")
def _align(top, s, et, ew, j0, j1, s_emin):
    """top = the block's alignment exponent: the largest of s's and the terms' e_a + e_w,
    four terms to a pass."""
    for i in range(TILE):
        top[i] = _exponent(s[i], s_emin)
    j = j0
    while j < j1:
        if j1 - j >= 4:
            e0, e1, e2, e3 = ew[j], ew[j + 1], ew[j + 2], ew[j + 3]
            for i in range(TILE):
                top[i] = np.int32(max(max(top[i], np.int32(et[j, i] + e0)),
                                      max(np.int32(et[j + 1, i] + e1),
                                          max(np.int32(et[j + 2, i] + e2), np.int32(et[j + 3, i] + e3)))))
            j += 4
        else:
            e0 = ew[j]
            for i in range(TILE):
                top[i] = np.int32(max(top[i], np.int32(et[j, i] + e0)))
            j += 1


@njit(cache=True, inline="always")
def _terms(isum, scale, top, at, w, j0, j1, adder_p):
    """isum = the block's truncated, scaled terms summed in int32; scale = 2**(p - 1 - top)."""
    for i in range(TILE):
        t_i = top[i]
        scale[i] = _pow2(np.int32(adder_p - 1 - t_i)) if t_i > _LIVE else np.float32(0.0)
        isum[i] = 0
    j = j0
    while j < j1:
        if j1 - j >= 4:
            w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
            for i in range(TILE):
                sc = scale[i]
                isum[i] = np.int32(isum[i] + np.int32(np.int32(_term(at[j, i], w0, sc) + _term(at[j + 1, i], w1, sc))
                                                      + np.int32(_term(at[j + 2, i], w2, sc)
                                                                 + _term(at[j + 3, i], w3, sc))))
            j += 4
        else:
            w0 = w[j]
            for i in range(TILE):
                isum[i] = np.int32(isum[i] + _term(at[j, i], w0, scale[i]))
            j += 1


@njit(cache=True, inline="always")
def _finish(s, isum, top, adder_p, block, mode, sat, normal):
    """s = (its truncated, scaled self + isum) * 2**q rounded to the block format, in
    float64: by `round_normal` where every sum is known to be normal, else `fast_round`
    (overflow, subnormals). An infinite running sum stays (the terms are finite)."""
    bp, below, bmax, btiny, binf, bkeep = block
    for i in range(TILE):
        sv, t_i = s[i], top[i]
        live = (t_i > _LIVE) & math.isfinite(sv)
        e = np.int64(adder_p - 1 - t_i) if live else np.int64(0)
        tv = float(isum[i]) + np.trunc(float(sv) * i2f((e + 1023) << 52))
        value = tv * i2f((1023 - e) << 52) if tv != 0.0 else 0.0
        if normal:
            y = round_normal(value, bp, mode)
        else:
            y = fast_round(value, bp, below, bmax, btiny, binf, bkeep, mode, sat, 0, 1)
        s[i] = np.float32(y) if live else sv


@njit(cache=True, inline="always")
def _fused_constant(s, at, et, j, ew, w, b, adder_p, mode, fp16):
    """`_block_fused` with the width, rounding mode and format as constants at each call
    site: with them as run-time values the pass does not vectorise (measured 2.4x slower)."""
    if fp16:
        _fused_mode(s, at, et, j, ew, w, b, adder_p, mode, True)
    else:
        _fused_mode(s, at, et, j, ew, w, b, adder_p, mode, False)


@njit(cache=True, inline="always")
def _fused_mode(s, at, et, j, ew, w, b, adder_p, mode, fp16):
    if b == 4:
        if mode == NEAREST_EVEN:
            _block_fused(s, at, et, j, ew, w, 4, adder_p, NEAREST_EVEN, fp16)
        else:
            _block_fused(s, at, et, j, ew, w, 4, adder_p, TOWARD_ZERO, fp16)
    elif mode == NEAREST_EVEN:
        _block_fused(s, at, et, j, ew, w, 8, adder_p, NEAREST_EVEN, fp16)
    else:
        _block_fused(s, at, et, j, ew, w, 8, adder_p, TOWARD_ZERO, fp16)


@njit(cache=True, inline="always")
def _finish_constant(s, isum, top, adder_p, block, mode, sat, normal):
    """`_finish` with the rounding mode and `normal` as constants (as `_fused_constant`)."""
    if normal:
        if mode == NEAREST_EVEN:
            _finish(s, isum, top, adder_p, block, NEAREST_EVEN, sat, True)
        else:
            _finish(s, isum, top, adder_p, block, TOWARD_ZERO, sat, True)
    elif mode == NEAREST_EVEN:
        _finish(s, isum, top, adder_p, block, NEAREST_EVEN, sat, False)
    else:
        _finish(s, isum, top, adder_p, block, TOWARD_ZERO, sat, False)


@njit(cache=True, inline="always")
def _add_c(s, c_in, acc, sat, normal):
    """s = s + c rounded once to the accumulator, nearest even (a separate addition of c)."""
    cp, celow, cmax, ctiny, cinf, ckeep = acc
    for i in range(TILE):
        x = add_odd(float(s[i]), float(c_in[i]))
        if normal:
            s[i] = np.float32(round_normal(x, cp, NEAREST_EVEN))
        else:
            s[i] = np.float32(fast_round(x, cp, celow, cmax, ctiny, cinf, ckeep, NEAREST_EVEN, sat, 0, 1))


@njit(cache=True, nogil=True)
def _gemm(t0, t1, a, w, ew, b, step, separate, adder_p, in_emin, s_emin, block, acc, mode, sat, normal, fused_blocks,
          out, skipped, pairs):
    """Row tiles t0 .. t1 - 1 of out (M, N) = the block-FMA sums, from +0, of a (M, K)
    float32 against w (N, K + 8) float32 (zeros past K, each column of the GEMM's w a row here), ew its exponents;
    `fused_blocks`: `fused`'s answer; `block`, `acc`: `round_limits` of the block format
    and the accumulator; `separate`: c
    (the running sum) is added after each MMA of `step` products, in one nearest
    rounding to the accumulator. Tiles of `a` holding an inf or NaN are
    skipped, and marked in `skipped`.

    `pairs` (M, K), when it has rows: out[m, 0] = the sums of a[m, :] * pairs[m, :] instead,
    as this GEMM with one column of ones (exponent 0) against the tile of products (exact
    in float32) whose exponents are e_a + e_b, the alignment's own sum. A tile holding an
    inf or NaN in either operand is skipped."""
    prefer_512_bit_vectors()
    m_count, k_count = a.shape
    n_count = w.shape[0]
    in_emin, s_emin = np.int32(in_emin), np.int32(s_emin)  # (int64 arguments widen the lanes)
    at = np.zeros((k_count + 8, TILE), dtype=np.float32)
    bt = np.zeros((k_count + 8 if pairs.shape[0] else 0, TILE), dtype=np.float32)
    et = np.empty((k_count + 8, TILE), dtype=np.int32)
    sums = np.empty((CHANNELS, TILE), dtype=np.float32)  # the running sums of a block of channels
    c_in = np.empty((CHANNELS, TILE), dtype=np.float32)
    top = np.empty(TILE, dtype=np.int32)
    isum = np.empty(TILE, dtype=np.int32)
    scale = np.empty(TILE, dtype=np.float32)
    for t in range(t0, t1):
        m0 = t * TILE
        rows = min(TILE, m_count - m0)
        load_tile(a, m0, rows, at)  # then the exponents in one pass
        at[:, rows:] = 0.0  # (a last, partial tile: no earlier tile's values)
        finite = True
        if pairs.shape[0]:
            load_tile(pairs, m0, rows, bt)
            bt[:, rows:] = 0.0
            for j in range(k_count + 8):
                for i in range(TILE):
                    v, u = at[j, i], bt[j, i]
                    at[j, i] = v * u
                    finite &= math.isfinite(v * u)  # (an inf or NaN operand: inf or NaN, times 0 too)
                    et[j, i] = np.int32(_exponent(v, in_emin) + _exponent(u, in_emin))
        else:
            for j in range(k_count + 8):
                for i in range(TILE):
                    v = at[j, i]
                    finite &= math.isfinite(v)
                    et[j, i] = _exponent(v, in_emin)
        skipped[t] = not finite
        if not finite:  # left to the float64 kernel
            continue
        for c0 in range(0, n_count, CHANNELS):
            c1 = min(c0 + CHANNELS, n_count)
            sums[:c1 - c0] = 0.0
            for s0 in range(0, k_count, step):
                if separate:
                    c_in[:c1 - c0] = sums[:c1 - c0]
                    sums[:c1 - c0] = 0.0
                for j0 in range(s0, min(s0 + step, k_count), b):
                    j1 = min(j0 + b, k_count)
                    for n in range(c0, c1):  # (the block's rows of the tile stay in the L1 cache)
                        s, wn, en = sums[n - c0], w[n], ew[n]
                        if fused_blocks:  # (j1 - j0 < b only at K's end, where the zero rows pad)
                            _fused_constant(s, at, et, j0, en[j0:j0 + 8], wn[j0:j0 + 8], b, adder_p, mode,
                                            fused_blocks == 2)
                        else:
                            _align(top, s, et, en, j0, j1, s_emin)
                            _terms(isum, scale, top, at, wn, j0, j1, adder_p)
                            _finish_constant(s, isum, top, adder_p, block, mode, sat, normal)
                if separate:
                    for n in range(c1 - c0):
                        _add_c(sums[n], c_in[n], acc, sat, normal)
            for n in range(c0, c1):
                for i in range(rows):
                    out[m0 + i, n] = sums[n - c0, i]


@njit(cache=True)
def _exponents(w, emin):
    out = np.empty(w.shape, dtype=np.int32)
    for j in range(w.shape[0]):
        for n in range(w.shape[1]):
            out[j, n] = _exponent(w[j, n], emin)
    return out


def gemm(a: np.ndarray, w: np.ndarray, model, normal: bool, block: tuple, acc_limits: tuple,
         mode: int) -> tuple:
    """(out, rows): out[m, n] = the block-FMA reduction from +0 of a[m, :] against w[:, n]
    (float64 or float32, w finite, K in the adder's order), rounded to the block format, for every
    row m but those in `rows` (the tiles holding an inf or NaN, for the float64 kernel);
    `applies` must hold. `block`: `round_limits` of the block format; `mode`: its
    rounding code; `acc_limits`, the accumulator's (for a separate addition of c)."""
    w32 = np.zeros((w.shape[1], w.shape[0] + 8), dtype=np.float32)
    w32[:, :w.shape[0]] = w.T
    return _run(a, w32, _exponents(w32, model.input.emin), np.zeros((0, 0), np.float32), model, normal, block,
                acc_limits, mode)


def rows(a: np.ndarray, b: np.ndarray, model, normal: bool, block: tuple, acc_limits: tuple, mode: int) -> tuple:
    """(out, rows): out[m] = the block-FMA reduction from +0 of a[m, :] * b[m, :] (`dot`'s
    rows, each with its own b), for every row m but those in `rows` (tiles holding an inf
    or NaN); the rest as `gemm`."""
    k = a.shape[1]
    out, skipped = _run(a, np.ones((1, k + 8), np.float32), np.zeros((1, k + 8), np.int32),
                        np.ascontiguousarray(b, np.float32), model, normal, block, acc_limits, mode)
    return out[:, 0], skipped


def _run(a, w32, ew, pairs, model, normal, block, acc_limits, mode) -> tuple:
    acc = model.accumulator
    out = np.empty((a.shape[0], w32.shape[0]))
    skipped = np.zeros((a.shape[0] + TILE - 1) // TILE, dtype=np.bool_)
    # (float32 always: exact for these inputs, and one compiled signature - each costs ~45 s of LLVM)
    over_tasks(_gemm, a.shape[0], np.ascontiguousarray(a, np.float32), w32, ew,
               model.b, model.step, model.c_addition == CAddition.SEPARATE, model.adder.precision + model.extra_bits,
               model.input.emin, acc.emin if acc.subnormals else -1022, block, acc_limits, mode,
               model.overflow == "saturate", normal, fused(model, normal), out, skipped, pairs,
               per_task=TILE)
    tiles = np.flatnonzero(skipped)
    rows = (tiles[:, None] * TILE + np.arange(TILE)).ravel()
    return out, rows[rows < a.shape[0]]
