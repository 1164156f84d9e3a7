"""The fast kernels and the fast twins of the one rounding routine.

* `fast_round` (branch-free, any value away from float64's underflow) and `round_normal`
  (results the formats prove normal): twins of `round_f64`, tested against it on every
  fp16 code point (tests/emulation/test_fast_rounding.py).
* `reduce_gemm_fast`: sequential and chunked models, row-tiled (one compiled kernel per
  rounding mode, and per mode one with a plain fp16 accumulator's limits as constants);
  two specialisations (nearest-even sequential; fp16 accumulation of fp16 products with
  one float64 add per term); `reduce_gemm_exact_fp16`: the exact model on
  fp16 inputs, each product split into two float64 sums that stay exact over a block of
  2**12 terms (folded into two int64 words past one block, for fp64 accumulators and for
  stochastic rounding). The row-tiled and fp16 kernels also read and write
  fp16 bit patterns (float16 carriers, `_kernels.fp16_carriers`).

Each kernel is tested bit for bit against the general kernel (`_kernels_reference`) in
tests/emulation/test_fast_path.py; `_kernels.gemm` picks them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import (ACCUMULATOR, ADDITION, CHUNKED, EXACT, F_EMIN,
                                                    F_HAS_INF, F_KEEP_SUB, F_MAX, F_PRECISION, IC_CHUNK,
                                                    IC_KIND, IC_MODE, IC_RBITS, IC_SAT, NEAREST_EVEN, OUTPUT,
                                                    PRODUCT, SEQUENTIAL, STOCHASTIC, TILE, TOTAL, TOWARD_ZERO, _MASK52,
                                                    _SIGN, add_odd, bitlen, f2i, fma_fp64, i2f, load_f64,
                                                    random_bits,
                                                    round_parts, round_slot, row_tile, same_format, special_sum, store_f64,
                                                    stream_bits, stream_key)
from convprobe.emulation._threads import over_tasks
from convprobe.formats import FP16


@njit(cache=True, inline="always")
def fast_round(x, p, elow, maxv, tiny, has_inf, keep_sub, mode, sat, r, rbits):
    """Branch-free `round_f64` for formats away from float64's underflow (see `fast_ok`).

    x must be exact or rounded to odd at >= p + 2 bits. Nearest-even adds and
    subtracts 1.5 * 2**(q + 52), which makes the FPU round at the quantum 2**q;
    toward-zero and stochastic clear the bits below 2**q. Every data-dependent choice
    is a select, so loops over outputs vectorise (`mode`, `sat`, `has_inf` and
    `keep_sub` are the same for every element). Same results as `round_f64` (tested).
    """
    b = f2i(x)
    e = (b >> 52) & 0x7FF
    qb = max(e, elow) - p + 1
    if mode == NEAREST_EVEN:
        c = i2f(((qb + 52) << 52) | (1 << 51))
        y = math.copysign((x + c) - c, x)
    else:
        raw = 52 - max(e, 1) + qb
        mask = (np.int64(1) << min(max(raw, 0), 63)) - 1
        y = i2f(b & ~mask if raw <= 52 else b & _SIGN)
        if mode == STOCHASTIC:
            mant = (b & _MASK52) | (np.int64(e > 0) << 52)
            frac = mant if raw >= 53 else mant & mask
            d = raw - rbits
            t = frac >> min(max(d, 0), 63) if d < 64 else 0
            y = y + math.copysign(i2f(qb << 52), x) if t + r >= (1 << rbits) else y
    ay = abs(y)
    overflow = math.copysign(maxv, y) if sat else (math.copysign(math.inf, y) if has_inf else math.nan)
    y = overflow if ay > maxv else y
    if not keep_sub:
        y = math.copysign(0.0, y) if ay < tiny else y
    special = x if (has_inf | (x != x)) else math.nan
    return special if e == 0x7FF else y


@njit(cache=True, inline="always")
def round_normal(x, p, mode):
    """`round_f64` of a float64 x that the caller knows to lie in the format's normal range,
    at least 2**emin and rounding to at most its largest value (precision p <= 51,
    nearest-even or toward zero): pure bit arithmetic on x's
    significand, with constant shifts (x exact, or rounded to odd at >= p + 2 bits).
    Toward zero clears the 53 - p low bits; nearest-even first adds half a quantum less
    one, plus the kept last bit, whose carry may move into the exponent, as it should."""
    b = f2i(x)
    shift = 53 - p
    mask = (np.int64(1) << shift) - 1
    if mode == NEAREST_EVEN:
        b = b + ((mask >> 1) + ((b >> shift) & 1))
    return i2f(b & ~mask)


def fast_roundable(fp, slot) -> bool:
    """A slot `fast_round` (or the native float64 add) can do: exact, or precision <= 51 and
    a range well inside float64's."""
    p, emin = int(fp[slot, F_PRECISION]), int(fp[slot, F_EMIN])
    return p == 0 or (p == 53 and emin == -1022) or (p <= 51 and emin >= -900)


def fast_ok(fp, ic) -> bool:
    """Whether `reduce_gemm_fast` applies: a sequential or chunked model whose roundings are
    fast_round-able; an fp64 accumulator (or chunk total) only with nearest-even rounding
    and no addition format (the native add)."""
    kind, nearest = ic[IC_KIND], ic[IC_MODE] == NEAREST_EVEN
    if kind not in (SEQUENTIAL, CHUNKED):
        return False
    slots = (PRODUCT, ADDITION, ACCUMULATOR, TOTAL) if kind == CHUNKED else (PRODUCT, ADDITION, ACCUMULATOR)
    if not all(fast_roundable(fp, slot) for slot in slots):
        return False
    if int(fp[ACCUMULATOR, F_PRECISION]) == 53 and not (nearest and fp[ADDITION, F_PRECISION] == 0.0):
        return False
    return not (kind == CHUNKED and int(fp[TOTAL, F_PRECISION]) == 53 and not nearest)


@njit(cache=True)
def round_limits(p, emin, maxv, has_inf, keep_sub):
    """`fast_round`'s arguments for a format: (p, elow, maxv, tiny, has_inf, keep_sub), where
    elow is the float64 biased exponent below which the format's quantum stops shrinking
    (its emin, or for a flushing format low enough that nothing is clamped)."""
    emin_b = emin + 1023
    elow = emin_b if keep_sub else emin_b - p - 1
    return p, elow, maxv, math.ldexp(1.0, emin), has_inf, keep_sub


#: `round_limits` of fp16 with subnormals kept and overflow to inf (`accumulates_fp16`), as constants.
_FP16_ROUND = round_limits.py_func(FP16.precision, FP16.emin, float(FP16.max), True, True)


@njit(cache=True, inline="always")
def _slot_params(fp, slot):
    return round_limits(int(fp[slot, F_PRECISION]), int(fp[slot, F_EMIN]), fp[slot, F_MAX],
                        fp[slot, F_HAS_INF] != 0.0, fp[slot, F_KEEP_SUB] != 0.0)


def reduce_gemm_fast(a, w, fp, ic, seed, out, col0):
    """`reduce_gemm` for sequential and chunked models: out[m, col0 + n] = the modelled sum
    over k of a[m, k] * w[k, n].

    Row-tiled: rows of `a` go in tiles of `TILE`, transposed (`load_tile`), and each inner
    loop runs across the tile's rows - independent running sums, unit stride. The
    rounding mode is a constant of each compiled kernel, and so are a plain fp16
    accumulator's limits and switches in the `_BY_MODE_FP16` ones (about half the CPU time
    of the general ones; elsewhere the switches are the same for every element)."""
    pp, ap, cp = (int(fp[slot, F_PRECISION]) for slot in (PRODUCT, ADDITION, ACCUMULATOR))
    add_kind = 0 if ap == 0 else (2 if ap == 53 else 1)
    chunk = int(ic[IC_CHUNK]) if ic[IC_KIND] == CHUNKED else 0
    plain_fp16 = accumulates_fp16(fp) and pp == 0 and ap == 0 and ic[IC_SAT] == 0
    kernel = (_BY_MODE_FP16 if plain_fp16 else _BY_MODE)[int(ic[IC_MODE])]
    over_tasks(kernel, a.shape[0], a, w, fp, seed, out, col0, int(ic[IC_RBITS]), chunk,
               bool(ic[IC_SAT] != 0), bool(pp != 0 and pp <= 51), add_kind, bool(cp == 53), chunk > 0,
               int(fp[TOTAL, F_PRECISION]) == 53, per_task=TILE)


def accumulates_fp16(fp) -> bool:
    """Whether the accumulator is fp16 with subnormals kept and overflow to inf: the kernels
    of `_BY_MODE_FP16` then take its rounding limits as constants (`_FP16_ROUND`), which
    lets LLVM fold `fast_round`'s exponent arithmetic in the inner loop."""
    return same_format(fp[ACCUMULATOR], FP16) and fp[ACCUMULATOR, F_KEEP_SUB] != 0.0


@njit(cache=True, inline="always")
def _add_fp64(x, y, sat, maxv):
    """x + y in float64, nearest; saturating keeps an overflow of finite operands finite."""
    t = x + y
    if sat:
        big = math.isinf(t) & math.isfinite(x) & math.isfinite(y)
        t = math.copysign(maxv, t) if big else t
    return t


@njit(cache=True, inline="always")
def _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, mode, sat, prod_round, add_kind, acc64,
                      chunked, total64, acc_fp16):
    """Row tiles t0 .. t1 - 1 of `reduce_gemm_fast`. Stochastic events follow
    `_kernels_reference.reduce_one`: term j is event j + (chunks finished before it), each
    chunk's addition to the total the next one, the output rounding the last. `acc_fp16`,
    a constant of each compiled kernel: the accumulator is `accumulates_fp16`'s format,
    whose limits are then constants."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    width = out.shape[1]
    pp, p_elow, p_max, p_tiny, p_inf, p_keep = _slot_params(fp, PRODUCT)
    ap, a_elow, a_max, a_tiny, a_inf, a_keep = _slot_params(fp, ADDITION)
    if acc_fp16:
        cp, c_elow, c_max, c_tiny, c_inf, c_keep = _FP16_ROUND
    else:
        cp, c_elow, c_max, c_tiny, c_inf, c_keep = _slot_params(fp, ACCUMULATOR)
    tp, t_elow, t_max, t_tiny, t_inf, t_keep = _slot_params(fp, TOTAL)
    for t in range(t0, t1):
        m0, rows, at = row_tile(a, t)
        s = np.empty(TILE)
        total = np.empty(TILE)
        keys = np.empty(TILE, dtype=np.uint32)  # each output's random stream
        for n in range(n_count):
            s[:] = 0.0
            total[:] = 0.0
            if mode == STOCHASTIC:
                for i in range(TILE):
                    keys[i] = stream_key(seed, (m0 + i) * width + col0 + n)
            ev = 0
            c = 0
            for k in range(k_count):
                wv = w[k, n]
                for i in range(TILE):
                    pv = at[k, i] * wv
                    if prod_round:
                        pv = fast_round(pv, pp, p_elow, p_max, p_tiny, p_inf, p_keep, NEAREST_EVEN, sat, 0, rbits)
                    sv = s[i]
                    if acc64:
                        s[i] = _add_fp64(sv, pv, sat, c_max)
                    else:
                        if add_kind == 0:
                            x = add_odd(sv, pv)
                        elif add_kind == 2:
                            x = sv + pv
                        else:
                            x = fast_round(add_odd(sv, pv), ap, a_elow, a_max, a_tiny, a_inf, a_keep,
                                           NEAREST_EVEN, sat, 0, rbits)
                        r = stream_bits(keys[i], ev, rbits) if mode == STOCHASTIC else 0
                        s[i] = fast_round(x, cp, c_elow, c_max, c_tiny, c_inf, c_keep, mode, sat, r, rbits)
                ev += 1
                c += 1
                if chunked and (c == chunk or k == k_count - 1):
                    for i in range(TILE):
                        if total64:
                            total[i] = _add_fp64(total[i], s[i], sat, t_max)
                        else:
                            r = stream_bits(keys[i], ev, rbits) if mode == STOCHASTIC else 0
                            total[i] = fast_round(add_odd(total[i], s[i]), tp, t_elow, t_max, t_tiny, t_inf,
                                                  t_keep, mode, sat, r, rbits)
                        s[i] = 0.0
                    ev += 1
                    c = 0
            for i in range(rows):
                r = stream_bits(keys[i], ev, rbits) if mode == STOCHASTIC else 0
                value = total[i] if chunked else s[i]
                out[m0 + i, col0 + n] = store_f64(out, round_slot(value, fp, OUTPUT, mode, sat, r, rbits))


# One compiled kernel per rounding mode and accumulator (`acc_fp16`), both constants there.


@njit(cache=True, nogil=True)
def _fast_nearest(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, sat, prod_round, add_kind, acc64, chunked, total64):
    _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, NEAREST_EVEN, sat, prod_round, add_kind, acc64,
                      chunked, total64, False)


@njit(cache=True, nogil=True)
def _fast_toward_zero(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, sat, prod_round, add_kind, acc64, chunked,
                      total64):
    _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, TOWARD_ZERO, sat, prod_round, add_kind, acc64,
                      chunked, total64, False)


@njit(cache=True, nogil=True)
def _fast_stochastic(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, sat, prod_round, add_kind, acc64, chunked,
                     total64):
    _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, STOCHASTIC, sat, prod_round, add_kind, acc64,
                      chunked, total64, False)


@njit(cache=True, nogil=True)
def _fp16_nearest(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, sat, prod_round, add_kind, acc64, chunked, total64):
    _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, NEAREST_EVEN, False, False, 0, False, chunked,
                      total64, True)


@njit(cache=True, nogil=True)
def _fp16_toward_zero(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, sat, prod_round, add_kind, acc64, chunked,
                      total64):
    _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, TOWARD_ZERO, False, False, 0, False, chunked,
                      total64, True)


@njit(cache=True, nogil=True)
def _fp16_stochastic(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, sat, prod_round, add_kind, acc64, chunked,
                     total64):
    _reduce_gemm_fast(t0, t1, a, w, fp, seed, out, col0, rbits, chunk, STOCHASTIC, False, False, 0, False, chunked,
                      total64, True)


_BY_MODE = {NEAREST_EVEN: _fast_nearest, TOWARD_ZERO: _fast_toward_zero, STOCHASTIC: _fast_stochastic}
_BY_MODE_FP16 = {NEAREST_EVEN: _fp16_nearest, TOWARD_ZERO: _fp16_toward_zero, STOCHASTIC: _fp16_stochastic}


def reduce_gemm_seq_nearest(a, w, p, emin, maxv, out, col0):
    """Specialised `reduce_gemm_fast`: exact products, exact additions, nearest-even,
    subnormals kept, overflow to inf, output = accumulator (precision p <= 51).

    Branch-free per term: the round-to-odd sum (`add_odd`'s TwoSum, inlined) rounded by
    `fast_round`; values that are inf or NaN keep the float64 sum (they are rare and
    sticky)."""
    over_tasks(_seq_nearest_rows, a.shape[0], a, w, p, emin, maxv, out, col0)


@njit(cache=True, nogil=True)
def _seq_nearest_rows(t0, t1, a, w, p, emin, maxv, out, col0):
    """Rows t0 .. t1 - 1 of `reduce_gemm_seq_nearest`."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    _, elow, _, tiny, _, _ = round_limits(p, emin, maxv, True, True)
    for m in range(t0, t1):
        s = np.zeros(n_count)
        for k in range(k_count):
            av = a[m, k]
            for n in range(n_count):
                s[n] = _add_nearest(s[n], av * w[k, n], p, elow, maxv, tiny)
        for n in range(n_count):
            out[m, col0 + n] = s[n]


@njit(cache=True, inline="always")
def _add_nearest(sv, pv, p, elow, maxv, tiny):
    """sv + pv rounded once, nearest even, to a format that keeps subnormals and overflows
    to inf: the round-to-odd sum (`add_odd`'s TwoSum, inlined and branch-free) rounded by
    `fast_round`; an inf or NaN sum stays the float64 sum (rare and sticky)."""
    t = sv + pv
    bb = t - sv
    err = (sv - (t - bb)) + (pv - bb)
    b = f2i(t)
    inex = np.int64(err != 0.0)
    opp = np.int64((b < 0) != (err < 0.0)) & inex
    y = fast_round(i2f((b - opp) | inex), p, elow, maxv, tiny, True, True, NEAREST_EVEN, False, 0, 1)
    return y if ((b >> 52) & 0x7FF) != 0x7FF else t


def reduce_terms_pairwise_nearest(terms, p, emin, maxv, out):
    """out[r] = the pairwise sum of terms[:, r] (P, R) under the conditions of
    `reduce_gemm_seq_nearest`: adjacent pairs added level by level, an odd last term
    carried up, as the general kernel's pairwise tree; vectorised across r."""
    over_tasks(_pairwise_nearest_tiles, terms.shape[1], terms, p, emin, maxv, out, per_task=TILE)


@njit(cache=True, nogil=True)
def _pairwise_nearest_tiles(t0, t1, terms, p, emin, maxv, out):
    """Column tiles t0 .. t1 - 1 of `reduce_terms_pairwise_nearest`."""
    k_count, r_count = terms.shape
    _, elow, _, tiny, _, _ = round_limits(p, emin, maxv, True, True)
    for t in range(t0, t1):
        r0 = t * TILE
        cols = min(TILE, r_count - r0)
        level = np.zeros((max(k_count, 1), TILE))
        for j in range(k_count):
            for i in range(cols):
                level[j, i] = terms[j, r0 + i]
        n = k_count
        while n > 1:
            half = n // 2
            for j in range(half):
                for i in range(TILE):
                    level[j, i] = _add_nearest(level[2 * j, i], level[2 * j + 1, i], p, elow, maxv, tiny)
            if n & 1:
                for i in range(TILE):
                    level[half, i] = level[n - 1, i]
            n = half + (n & 1)
        for i in range(cols):  # (a lone term meets the output rounding alone, as in the general kernel)
            v = level[0, i]
            out[r0 + i] = fast_round(v, p, elow, maxv, tiny, True, True, NEAREST_EVEN, False, 0, 1) if k_count == 1 else v


_FP16_LIMITS = (FP16.precision, FP16.emin, float(FP16.max))


def reduce_gemm_fp16_direct(a, w, keep_sub, add32, out, col0):
    """Sequential fp16 accumulation of fp16 (or fp8) products, nearest-even, overflow
    to inf: one float64 add and one rounding (`fast_round`) per term, no TwoSum, four rows
    of `a` per task (with a short N one row's chains would wait on the rounding's latency).
    With `add32` each addition is the hardware float32 add (exact operands: s is fp16 and p
    has 22 bits), then rounded to fp16 - the `addition=fp32` model, two roundings.
    (Where the CPU has F16C, `_native_fp16` takes these models, and their chunked form,
    unless they flush subnormals.)

    a, w and out are float64 arrays, or uint16 arrays holding fp16 bit patterns (the
    float16 carriers, converted in registers by F16C: `load_f64`, `store_f64`),
    which spare im2col three quarters of its memory traffic.

    Why one float64 add suffices: s is fp16 and p = a*b has at most 22 significand
    bits, both multiples of 2**-48. If s + p is inexact in float64, the two
    exponents differ by more than 31 (|p| << |s|) or 42 (|s| << |p|). In the first
    case float64 rounding moves the sum by less than 2**-52 |s|, which cannot reach or
    leave an fp16 rounding boundary (those sit at multiples of 2**(e_s - 11), and
    |p| < 2**(e_s - 31), and a nearest-even boundary is a midpoint, never s itself); in
    the second, |p| >= 2**18 because |s| >= 2**-24, so the sum overflows fp16 whichever
    way it is rounded. Toward zero is NOT safe (float64 can round s - tiny up to s,
    which then truncates to s instead of s - ulp; found by the tests), nor is
    stochastic rounding, so both take the round-to-odd kernels. Tested bit for bit
    against the general kernel and the oracle.
    """
    over_tasks(_fp16_direct_tasks, a.shape[0], a, w, keep_sub, add32, out, col0, per_task=_ROWS)


@njit(cache=True, nogil=True)
def _fp16_direct_tasks(t0, t1, a, w, keep_sub, add32, out, col0):
    """Tasks (four rows each) t0 .. t1 - 1 of `reduce_gemm_fp16_direct`."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    p, emin, maxv = _FP16_LIMITS
    _, elow, _, tiny, _, _ = round_limits(p, emin, maxv, True, keep_sub)
    last = m_count - 1
    for t in range(t0, t1):
        m0 = t * _ROWS
        s = np.zeros((_ROWS, n_count))
        for k in range(k_count):  # (rows past the end repeat the last one, and are not stored)
            a0, a1 = load_f64(a[m0, k]), load_f64(a[min(m0 + 1, last), k])
            a2, a3 = load_f64(a[min(m0 + 2, last), k]), load_f64(a[min(m0 + 3, last), k])
            for n in range(n_count):
                wv = load_f64(w[k, n])
                s[0, n] = _direct_step(s[0, n], a0 * wv, add32, p, elow, maxv, tiny, keep_sub)
                s[1, n] = _direct_step(s[1, n], a1 * wv, add32, p, elow, maxv, tiny, keep_sub)
                s[2, n] = _direct_step(s[2, n], a2 * wv, add32, p, elow, maxv, tiny, keep_sub)
                s[3, n] = _direct_step(s[3, n], a3 * wv, add32, p, elow, maxv, tiny, keep_sub)
        for r in range(min(_ROWS, m_count - m0)):
            for n in range(n_count):
                out[m0 + r, col0 + n] = store_f64(out, s[r, n])


_ROWS = 4  # rows of `a` per task of the direct kernel: four independent rounding chains per lane


@njit(cache=True, inline="always")
def _direct_step(sv, pv, add32, p, elow, maxv, tiny, keep_sub):
    """One step of the direct kernel: s + p in float64 (or, `add32`, in float32), rounded
    to fp16 by `fast_round`; an inf or NaN sum stays the float64 sum (rare and sticky)."""
    t = np.float64(np.float32(sv) + np.float32(pv)) if add32 else sv + pv
    y = fast_round(t, p, elow, maxv, tiny, True, keep_sub, NEAREST_EVEN, False, 0, 1)
    return y if ((f2i(t) >> 52) & 0x7FF) != 0x7FF else t


_LOW_BITS = 48  # fp16 (and fp8) products are multiples of 2**-48 (2**-24 squared), below 2**32
_SPLIT = 2.0**-8  # each product splits into a multiple of this (its head) and a tail below half of it
_SPLITTER = 1.5 * 2.0**52 * _SPLIT  # fma(a, w, _SPLITTER) - _SPLITTER: a * w rounded to a multiple of _SPLIT
_BLOCK = 1 << 12  # terms per float64 block: heads sum below 2**45 (53 bits at 2**-8), tails below 2**3


@njit(cache=True, inline="always")
def _carry(high, low):
    """(high, low) with low reduced to [0, 2**48): the same value high + low * 2**-48."""
    c = low >> _LOW_BITS
    return high + c, low - (c << _LOW_BITS)


@njit(cache=True, inline="always")
def _fixed(x):
    """A block's head or tail sum x (a multiple of 2**-48 below 2**45 in magnitude) as
    (whole, fraction * 2**48), two exact int64s."""
    whole = np.trunc(x)
    return np.int64(whole), np.int64((x - whole) * 2.0**_LOW_BITS)


@njit(cache=True)
def _round_fixed(high, low, fp, mode, sat, r, rbits):
    """Round high + low * 2**-48 (0 <= low < 2**48) once to the accumulator: its sign,
    a significand below 2**63 with a sticky bit, handed to `round_parts`."""
    neg = high < 0
    if neg:  # |value| = (-high - 1) + (2**48 - low) * 2**-48, or -high when low = 0
        if low == 0:
            high = -high
        else:
            high, low = -high - 1, (np.int64(1) << _LOW_BITS) - low
    if high == 0:
        mant, lsb, sticky = low, -_LOW_BITS, False
    else:
        sh = max(bitlen(high) + _LOW_BITS - 63, 0)
        mant = (high << (_LOW_BITS - sh)) | (low >> sh)
        sticky = (low & ((np.int64(1) << sh) - 1)) != 0
        lsb = sh - _LOW_BITS
    return round_parts(neg, mant, lsb, sticky, int(fp[ACCUMULATOR, F_PRECISION]), int(fp[ACCUMULATOR, F_EMIN]),
                       fp[ACCUMULATOR, F_MAX], fp[ACCUMULATOR, F_HAS_INF] != 0.0,
                       fp[ACCUMULATOR, F_KEEP_SUB] != 0.0, mode, sat, r, rbits)


def exact_fp16_ok(fp, ic, inputs_fp16) -> bool:
    """Whether `reduce_gemm_exact_fp16` applies: the exact model on fp16 (or fp8) inputs
    with exact products."""
    return inputs_fp16 and ic[IC_KIND] == EXACT and fp[PRODUCT, F_PRECISION] == 0.0


def reduce_gemm_exact_fp16(a, w, fp, ic, seed, out, col0):
    """The exact model (one rounding of the exact sum) for fp16 or fp8 inputs, row-tiled
    and vectorised across the tile's rows in float64 arithmetic, no long accumulator
    (`superacc_add`).

    Each product p = a * w is exact (a multiple of 2**-48 below 2**32) and splits, without
    error, into a head h = fma(a, w, 1.5 * 2**44) - 1.5 * 2**44 (p rounded to a multiple of
    2**-8) and a tail fma(a, w, -h) = p - h (a multiple of 2**-48, at most 2**-9 in
    magnitude). Over a block of 2**12 terms the heads sum below 2**45 and the tails below
    2**3, within float64's 53 bits at their quanta: both float64 sums are exact. With K in
    one block and a target of at most 51 bits, rounding nearest or toward zero, head + tail
    rounded to odd is rounded once (`fast_round`, or `round_slot` for formats near float64's
    limits) as the exact sum would be. Otherwise each block's sums move, exactly, into a
    two-word int64 fixed point (integer part, fraction * 2**48), rounded once at the end
    (`_round_fixed`). An inf or NaN product makes the tail sum NaN; those outputs take the
    IEEE rule of the general kernel."""
    over_tasks(_exact_fp16_tiles, a.shape[0], a, w, fp, ic, seed, out, col0, per_task=TILE)


@njit(cache=True, nogil=True)
def _exact_fp16_tiles(t0, t1, a, w, fp, ic, seed, out, col0):
    """Row tiles t0 .. t1 - 1 of `reduce_gemm_exact_fp16`."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    width = out.shape[1]
    mode = ic[IC_MODE]
    sat = ic[IC_SAT] != 0
    rbits = ic[IC_RBITS]
    # one block, rounded by nearest even or toward zero to at most 51 bits: head + tail rounded
    # to odd in float64 is then rounded once as the exact sum would be (no fixed point)
    odd = k_count <= _BLOCK and 0 < fp[ACCUMULATOR, F_PRECISION] <= 51 and mode != STOCHASTIC
    # ... and by `fast_round`, vectorised, where both formats lie well inside float64's range
    vector_finish = odd and 0 < fp[OUTPUT, F_PRECISION] <= 51 and min(fp[ACCUMULATOR, F_EMIN], fp[OUTPUT, F_EMIN]) >= -900
    acc_limits, out_limits = _slot_params(fp, ACCUMULATOR), _slot_params(fp, OUTPUT)
    for t in range(t0, t1):
        m0, rows, at = row_tile(a, t)
        head = np.empty(TILE)
        tail = np.empty(TILE)
        high = np.empty(TILE, dtype=np.int64)
        low = np.empty(TILE, dtype=np.int64)
        special = np.empty(TILE, dtype=np.bool_)
        finished = np.empty(TILE)
        for n in range(n_count):
            high[:] = 0
            low[:] = 0
            special[:] = False
            for k0 in range(0, max(k_count, 1), _BLOCK):  # (K = 0: one empty block, sums +0)
                head[:] = 0.0
                tail[:] = 0.0
                for k in range(k0, min(k0 + _BLOCK, k_count)):
                    wv = np.float64(w[k, n])
                    for i in range(TILE):
                        h = fma_fp64(at[k, i], wv, _SPLITTER) - _SPLITTER
                        head[i] += h
                        tail[i] += fma_fp64(at[k, i], wv, -h)
                if odd:
                    break
                for i in range(TILE):
                    special[i] |= tail[i] != tail[i]
                    hw, hf = _fixed(head[i]) if not special[i] else (0, 0)
                    tw, tf = _fixed(tail[i]) if not special[i] else (0, 0)
                    high[i], low[i] = _carry(high[i] + hw + tw, low[i] + hf + tf)
            if vector_finish:
                if mode == NEAREST_EVEN:
                    _round_odd_sums(head, tail, acc_limits, out_limits, NEAREST_EVEN, sat, finished)
                else:
                    _round_odd_sums(head, tail, acc_limits, out_limits, TOWARD_ZERO, sat, finished)
                for i in range(rows):
                    bad = tail[i] != tail[i]
                    out[m0 + i, col0 + n] = finished[i] if not bad else round_slot(
                        _ieee_sum_of_specials(a, w, m0 + i, n), fp, OUTPUT, mode, sat, 0, rbits)
                continue
            for i in range(rows):
                m = m0 + i
                index = m * width + col0 + n
                r0 = random_bits(seed, index, 0, rbits) if mode == STOCHASTIC else 0
                r1 = random_bits(seed, index, 1, rbits) if mode == STOCHASTIC else 0
                if odd:
                    bad = tail[i] != tail[i]
                    s = _ieee_sum_of_specials(a, w, m, n) if bad else round_slot(add_odd(head[i], tail[i]), fp,
                                                                                   ACCUMULATOR, mode, sat, 0, rbits)
                elif special[i]:
                    s = _ieee_sum_of_specials(a, w, m, n)
                else:
                    s = _round_fixed(high[i], low[i], fp, mode, sat, r0, rbits)
                out[m, col0 + n] = round_slot(s, fp, OUTPUT, mode, sat, r1, rbits)


@njit(cache=True, inline="always")
def _round_odd_sums(head, tail, acc_limits, out_limits, mode, sat, finished):
    """finished[i] = head[i] + tail[i] (exact float64s) rounded once to the accumulator,
    then to the output (`fast_round`, branch-free: the loop vectorises); `mode` a constant."""
    cp, c_elow, c_max, c_tiny, c_inf, c_keep = acc_limits
    op, o_elow, o_max, o_tiny, o_inf, o_keep = out_limits
    for i in range(TILE):
        y = fast_round(add_odd(head[i], tail[i]), cp, c_elow, c_max, c_tiny, c_inf, c_keep, mode, sat, 0, 1)
        finished[i] = fast_round(y, op, o_elow, o_max, o_tiny, o_inf, o_keep, mode, sat, 0, 1)


@njit(cache=True)
def _ieee_sum_of_specials(a, w, m, n):
    """The exact model's result for output (m, n) when some product is inf or NaN."""
    pinf = ninf = nan = False
    for k in range(a.shape[1]):
        p = a[m, k] * w[k, n]
        nan |= p != p
        pinf |= p == math.inf
        ninf |= p == -math.inf
    return special_sum(nan, pinf, ninf)
