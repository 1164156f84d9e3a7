"""The block-FMA adder compiled (numba) for GEMMs, in float64 lanes: the hot path of
convolutions under tensor-core models where `_block_fma_narrow` (32-bit lanes, fp16 and
fp8 inputs) does not apply - bf16 and tf32 inputs, an accumulator input, inf and NaN.

Same definition as `_block_fma` (NumPy, any parameters) and the oracle; this kernel
covers every GPU preset - exact products, alignment to e_a + e_b, truncation, one MMA
of `step` products in blocks of `b` (c fused into the first block, or added after the
MMA in one nearest rounding), any accumulator input (convolutions start from +0); a
pair-interleaved layout is a permutation of K done by the caller.

Layout: rows of `a` go in tiles of `TILE`, transposed into a (K, tile) scratch with
their exponents, so every inner loop runs over the tile's rows - long, unit-stride,
branch-free loops that the compiler vectorises - for one output channel at a time.
Rare non-finite lanes are redone one by one after each block (the IEEE sum, as in
`_block_fma`). Why float64 is exact here is `_block_fma`'s argument; the scaling by
2**-q is a multiplication by a power of two built from its bits, exact while 2**-q and
the scaled terms stay normal, which `applies` checks from the formats' ranges. Each
block's sum is rounded by `round_normal` where the formats prove it normal, else by
`fast_round`: the tested twins of the one rounding routine.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from convprobe.emulation import _block_fma_narrow as narrow_kernel
from convprobe.emulation._kernel_arithmetic import NEAREST_EVEN, TILE, add_odd, f2i, i2f, load_tile
from convprobe.emulation._kernel_arithmetic import NO_EXPONENT as _NONE
from convprobe.emulation._kernels_fast import fast_round, round_limits, round_normal
from convprobe.emulation._threads import over_tasks
from convprobe.options import Alignment, CAddition

__all__ = ["applies", "gemm"]



def applies(model) -> bool:
    """Whether `gemm` computes `model` (otherwise `_block_fma.gemm` does)."""
    adder_p = model.adder.precision + model.extra_bits
    acc = model.accumulator
    # quanta 2**q with q = E - adder_p + 1: E >= 2 * input emin - 2 (subnormal inputs clamp at
    # emin; the product's own bits reach 2 * (emin - p_in + 1)), so 2**-q and term * 2**-q
    # stay far inside float64's normal range for every registered input format; fast_round
    # needs an accumulator (and so a block format, never wider) of at most 51 bits well
    # inside float64's range. Blocked models round to nearest or toward zero only.
    return (model.product == "exact" and model.alignment == Alignment.INPUT_EXPONENTS
            and model.truncate
            and 2 * model.input.emin - 2 - adder_p > -1000 and model.input.emax * 2 + 4 < 1000
            and acc.emin - adder_p > -1000 and acc.emax < 1000
            and acc.precision <= 51 and acc.emin > -900)


@njit(cache=True, inline="always")
def _exponent(x, emin):
    """floor(log2|x|) clamped at emin (>= -1022); _NONE for 0, inf and NaN (which take no
    part in alignment: their blocks go the IEEE way). Sums of two stay below _NONE // 2."""
    e = ((f2i(x) >> 52) & 0x7FF) - 1023
    return _NONE if ((x == 0.0) | (e == 1024)) else max(e, emin)


@njit(cache=True, inline="always")
def _pow2(e):
    """2**e for -1022 <= e <= 1023, from its bits."""
    return i2f(np.int64(e + 1023) << 52)


@njit(cache=True, inline="always")
def _exponents_first(top, s, s_emin, et, j, e0, e1, e2, e3, width):
    """top = max(exponent of s, e_a + e_w of terms j..j+width-1), width 1 or 4."""
    for i in range(TILE):
        t = _exponent(s[i], s_emin)
        t = max(t, et[j, i] + e0)
        if width == 4:
            t = max(max(t, et[j + 1, i] + e1), max(et[j + 2, i] + e2, et[j + 3, i] + e3))
        top[i] = t


@njit(cache=True, inline="always")
def _exponents_more(top, et, j, e0, e1, e2, e3, width):
    for i in range(TILE):
        t = max(top[i], et[j, i] + e0)
        if width == 4:
            t = max(max(t, et[j + 1, i] + e1), max(et[j + 2, i] + e2, et[j + 3, i] + e3))
        top[i] = t


@njit(cache=True, inline="always")
def _terms_first(total, scale, top, s, at, j, w0, w1, w2, w3, width, adder_p):
    """scale = 2**(adder_p - 1 - top) (0 for an all-zero block); total = the truncated,
    scaled s plus the first terms (a float trunc: NaN stays NaN)."""
    for i in range(TILE):
        t_i = top[i]
        sc = _pow2(adder_p - 1 - t_i) if t_i > _NONE // 2 else 0.0
        scale[i] = sc
        t = np.trunc(s[i] * sc) + np.trunc(at[j, i] * w0 * sc)
        if width == 4:
            t += (np.trunc(at[j + 1, i] * w1 * sc) + np.trunc(at[j + 2, i] * w2 * sc)) + \
                np.trunc(at[j + 3, i] * w3 * sc)
        total[i] = t


@njit(cache=True, inline="always")
def _terms_more(total, scale, at, j, w0, w1, w2, w3, width):
    for i in range(TILE):
        sc = scale[i]
        t = total[i] + np.trunc(at[j, i] * w0 * sc)
        if width == 4:
            t += (np.trunc(at[j + 1, i] * w1 * sc) + np.trunc(at[j + 2, i] * w2 * sc)) + \
                np.trunc(at[j + 3, i] * w3 * sc)
        total[i] = t


@njit(cache=True, inline="always")
def _round_block(s, total, top, adder_p, bp, below, bmax, btiny, binf, bkeep, mode, sat, normal):
    """s = the block's sum (total * 2**q) rounded: by `round_normal` where every sum is known
    to be normal (`normal`, a constant at each call site, so the choice folds away and the
    loop vectorises), else by `fast_round`. Returns whether any lane met an inf or NaN
    (those lanes keep s, for the IEEE fix-up)."""
    special = False
    for i in range(TILE):
        sv, tv = s[i], total[i]
        ok = math.isfinite(tv) & math.isfinite(sv)
        special |= not ok
        t_i = top[i]
        live = t_i > _NONE // 2
        value = tv * _pow2(t_i - adder_p + 1) if (live & (tv != 0.0)) else 0.0
        if normal:
            y = round_normal(value, bp, mode)
        else:
            y = fast_round(value, bp, below, bmax, btiny, binf, bkeep, mode, sat, 0, 1)
        s[i] = y if (live & ok) else sv  # an exact zero sum is +0
    return special


@njit(cache=True, inline="always")
def _align(top, s, s_emin, et, ew, j0, j1):
    """top = the block's alignment exponent: the largest of s's and the terms' e_a + e_w."""
    j = j0
    while j < j1:
        width = 4 if j1 - j >= 4 else 1
        if j == j0:
            _exponents_first(top, s, s_emin, et, j, ew[j], ew[j + 1], ew[j + 2], ew[j + 3], width)
        else:
            _exponents_more(top, et, j, ew[j], ew[j + 1], ew[j + 2], ew[j + 3], width)
        j += width


@njit(cache=True, inline="always")
def _sum_terms(total, scale, top, s, at, w, j0, j1, adder_p):
    """total = the block's truncated, scaled s and terms; scale = 2**(adder_p - 1 - top)."""
    j = j0
    while j < j1:
        width = 4 if j1 - j >= 4 else 1
        if j == j0:
            _terms_first(total, scale, top, s, at, j, w[j], w[j + 1], w[j + 2], w[j + 3], width, adder_p)
        else:
            _terms_more(total, scale, at, j, w[j], w[j + 1], w[j + 2], w[j + 3], width)
        j += width


@njit(cache=True, inline="always")
def _block_of_four(s, total, at, et, j, ew, w, s_emin, adder_p, bp, mode):
    """A whole block of four terms in one pass over the tile (alignment, truncated sum,
    rounding; sums known to be normal): `_align`, `_sum_terms` and `_round_block`
    fused, for the commonest block size (V100, TF32 on Ampere and Ada)."""
    e0, e1, e2, e3 = ew[0], ew[1], ew[2], ew[3]
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    special = False
    for i in range(TILE):
        sv = s[i]
        a0, a1, a2, a3 = at[j, i], at[j + 1, i], at[j + 2, i], at[j + 3, i]
        top = max(max(_exponent(sv, s_emin), et[j, i] + e0),
                  max(et[j + 1, i] + e1, max(et[j + 2, i] + e2, et[j + 3, i] + e3)))
        live = top > _NONE // 2
        sc = _pow2(adder_p - 1 - top) if live else 0.0
        tv = (np.trunc(sv * sc) + np.trunc(a0 * w0 * sc)) + (np.trunc(a1 * w1 * sc) + (
            np.trunc(a2 * w2 * sc) + np.trunc(a3 * w3 * sc)))
        total[i] = tv
        ok = math.isfinite(tv) & math.isfinite(sv)
        special |= not ok
        value = tv * _pow2(top - adder_p + 1) if (live & (tv != 0.0)) else 0.0
        s[i] = round_normal(value, bp, mode) if (live & ok) else sv  # an exact zero sum is +0
    return special


@njit(cache=True, nogil=True)
def _gemm(t0, t1, a, w, ew, b, step, separate, adder_p, in_emin, s_emin, block, acc, mode, sat, normal, out):
    """Row tiles t0 .. t1 - 1 of `gemm`. `block`, `acc`: (p, elow, maxv, tiny, has_inf,
    keep_sub) of the block-sum format and the accumulator (`round_limits`); s_emin: the
    clamp of the running sum's exponent; ew: the exponents of w; normal: every block sum
    is known to round to a normal number (`round_normal` suffices).

    Terms go four at a time through each pass over the tile (one load and store of the
    running values per four terms): summing a block's truncated terms in any order is
    exact, so the grouping changes nothing."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    bp, below, bmax, btiny, binf, bkeep = block
    cp, celow, cmax, ctiny, cinf, ckeep = acc
    for t in range(t0, t1):
        m0 = t * TILE
        rows = min(TILE, m_count - m0)
        at = np.zeros((k_count + 3, TILE))
        et = np.full((k_count + 3, TILE), _NONE, dtype=np.int64)
        load_tile(a, m0, rows, at)
        for j in range(k_count):
            for i in range(rows):
                et[j, i] = _exponent(at[j, i], in_emin)
        s = np.empty(TILE)
        c_in = np.empty(TILE)
        top = np.empty(TILE, dtype=np.int64)
        total = np.empty(TILE)
        scale = np.empty(TILE)
        for n in range(n_count):
            s[:] = 0.0
            for i in range(rows):  # the accumulator input: +0 for convolutions
                s[i] = out[m0 + i, n]
            for s0 in range(0, k_count, step):
                if separate:
                    c_in[:] = s
                    s[:] = 0.0
                for j0 in range(s0, min(s0 + step, k_count), b):
                    j1 = min(j0 + b, k_count)
                    if b == 4 and normal:  # one fused pass for the commonest block size
                        special = _block_of_four(s, total, at, et, j0, ew[j0:j0 + 4, n], w[j0:j0 + 4, n],
                                                 s_emin, adder_p, bp, mode)
                    else:
                        _align(top, s, s_emin, et, ew[:, n], j0, j1)
                        _sum_terms(total, scale, top, s, at, w[:, n], j0, j1, adder_p)
                        if normal:
                            special = _round_block(s, total, top, adder_p, bp, below, bmax, btiny, binf,
                                                   bkeep, mode, sat, True)
                        else:
                            special = _round_block(s, total, top, adder_p, bp, below, bmax, btiny, binf,
                                                   bkeep, mode, sat, False)
                    if special:  # an inf or NaN in the block: the IEEE sum of s and the products
                        for i in range(TILE):
                            if not math.isfinite(total[i]):  # (a non-finite s makes total so)
                                tv = s[i]
                                for j in range(j0, j1):
                                    tv += at[j, i] * w[j, n]
                                s[i] = tv
                if separate:  # one nearest rounding of s + c
                    for i in range(TILE):
                        x = add_odd(s[i], c_in[i])
                        if normal:
                            s[i] = round_normal(x, cp, NEAREST_EVEN)
                        else:
                            s[i] = fast_round(x, cp, celow, cmax, ctiny, cinf, ckeep, NEAREST_EVEN, sat, 0, 1)
            for i in range(rows):
                out[m0 + i, n] = s[i]


@njit(cache=True)
def _exponents(w, emin):
    """The clamped exponents of w (K, N); zero rows (the padding) give _NONE."""
    out = np.empty(w.shape, dtype=np.int64)
    for j in range(w.shape[0]):
        for n in range(w.shape[1]):
            out[j, n] = _exponent(w[j, n], emin)
    return out


def _sums_stay_normal(model, k: int) -> bool:
    """Whether every nonzero block sum and running sum of K finite terms is a normal number
    of the block and accumulator formats, whatever the inputs: each is a nonzero multiple of
    a quantum 2**q with q >= 2 * input emin - adder_p + 1 (clamped exponents), and, with
    room for the roundings' growth, below 4 * (K + 1) * (largest input)**2."""
    fin = model.input
    smallest = 2 * fin.emin - (model.adder.precision + model.extra_bits) + 1
    largest = (k + 1) * fin.max**2 * 4
    return all(smallest >= fmt.emin and largest < fmt.max for fmt in (model.block_format, model.accumulator))


def _limits(fmt, keep_sub: bool) -> tuple:
    """`fast_round`'s view of a format (see `_kernels_fast.round_limits`)."""
    return round_limits(fmt.precision, fmt.emin, float(fmt.max), fmt.has_inf, keep_sub)


def gemm(a: np.ndarray, w: np.ndarray, model, c: np.ndarray | None = None, narrow: bool = True) -> np.ndarray:
    """out[m, n] = the block-FMA reduction of c[m, n] (values of the accumulator; +0 when
    None) plus a[m, :] against w[:, n] (float64, K already in the adder's order), rounded to
    the accumulator. Convolutions pass no c; the test that replays the real MMA vectors
    through this kernel does (`dot(c=...)` takes the NumPy path; `dot`'s rows without c,
    each with its own b, take `rows`). With `narrow` (the default), the 32-bit-lane kernel of `_block_fma_narrow`
    computes what it can - fp16/fp8 inputs, finite w, no c - and this float64 kernel the
    rows of tiles holding an inf or NaN; `narrow=False` is this kernel alone (the tests
    compare both)."""
    acc = model.accumulator
    normal = _sums_stay_normal(model, a.shape[1]) and (c is None or not np.any(c))
    from_plus_zero = c is None or not (np.any(c) or np.signbit(c).any())  # (the 32-bit kernel starts at +0)
    if narrow and narrow_kernel.applies(model) and from_plus_zero and np.isfinite(w).all():
        out, rows = narrow_kernel.gemm(a, w, model, normal, *_rounding_arguments(model))
        if rows.size:  # the tiles holding an inf or NaN: the IEEE fix-ups below
            out[rows] = gemm(a[rows], w, model, narrow=False)
        return out
    a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
    shape = (a.shape[0], w.shape[1])
    out = np.zeros(shape) if c is None else np.array(np.broadcast_to(c, shape), dtype=np.float64)
    w_padded = np.zeros((w.shape[0] + 3, w.shape[1]))
    w_padded[:w.shape[0]] = w
    over_tasks(_gemm, a.shape[0], np.ascontiguousarray(a), w_padded,
               _exponents(w_padded, model.input.emin), model.b, model.step,
               model.c_addition == CAddition.SEPARATE, model.adder.precision + model.extra_bits,
               model.input.emin, acc.emin if acc.subnormals else -1022,
               *_rounding_arguments(model), model.overflow == "saturate", normal, out, per_task=TILE)
    return out


def rows(a: np.ndarray, b: np.ndarray, model) -> tuple | None:
    """(out, rows) where the 32-bit-lane kernel applies (fp16/fp8 inputs), else None:
    out[m] = the block-FMA reduction from +0 of a[m, :] * b[m, :] (K already in the adder's
    order), rounded to the accumulator, for every row m but those in `rows` (tiles holding
    an inf or NaN, which the caller computes otherwise)."""
    if not narrow_kernel.applies(model):
        return None
    return narrow_kernel.rows(a, b, model, _sums_stay_normal(model, a.shape[1]), *_rounding_arguments(model))


def _rounding_arguments(model) -> tuple:
    """Every kernel's rounding arguments: the block format's and the accumulator's limits,
    the rounding mode's code."""
    from convprobe.emulation.rounding import MODE_CODES  # (rounding imports the kernels)

    fmt, acc = model.block_format, model.accumulator
    return (_limits(fmt, fmt.subnormals and model.subnormals == "keep"),
            _limits(acc, acc.subnormals and model.subnormals == "keep"), MODE_CODES[model.rounding])
