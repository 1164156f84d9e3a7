"""The fast kernels: sequential models vectorised across output channels, and two
specialisations (nearest-even sequential; fp16 accumulation of fp16 products with one
float64 add per term). Each is tested bit for bit against the general kernel
(`_kernels_reference`) in tests/emulation/test_fast_path.py; `_kernels.gemm` picks them."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from convprobe.emulation._kernel_arithmetic import (ACCUMULATOR, ADDITION, EXACT, F_EMIN, F_HAS_INF,
                                                    F_KEEP_SUB, F_MAX, F_PRECISION, IC_KIND, IC_MODE, IC_RBITS,
                                                    IC_SAT, NEAREST_EVEN, OUTPUT, PRODUCT, SEQUENTIAL,
                                                    STOCHASTIC, _MASK52, _SIGN, add_odd, bitlen, f2i, i2f,
                                                    random_bits, round_parts, round_slot, stream_bits,
                                                    stream_key)
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


def fast_ok(fp, ic) -> bool:
    """Whether `reduce_gemm_fast` applies: a sequential model whose roundings are
    fast_round-able (precision <= 51, range well inside float64) or fp64 nearest."""
    if ic[IC_KIND] != SEQUENTIAL:
        return False
    for slot in (PRODUCT, ADDITION, ACCUMULATOR):
        p, emin = int(fp[slot, F_PRECISION]), int(fp[slot, F_EMIN])
        if p == 0 or (p == 53 and emin == -1022 and slot == PRODUCT):
            continue
        if p == 53 and emin == -1022 and slot == ACCUMULATOR:
            if ic[IC_MODE] == NEAREST_EVEN and fp[ADDITION, F_PRECISION] == 0.0:
                continue
            return False
        if p == 53 and emin == -1022 and slot == ADDITION:
            continue
        if p > 51 or emin < -900:
            return False
    return True


@njit(cache=True)
def round_limits(p, emin, maxv, has_inf, keep_sub):
    """`fast_round`'s arguments for a format: (p, elow, maxv, tiny, has_inf, keep_sub), where
    elow is the float64 biased exponent below which the format's quantum stops shrinking
    (its emin, or for a flushing format low enough that nothing is clamped)."""
    emin_b = emin + 1023
    elow = emin_b if keep_sub else emin_b - p - 1
    return p, elow, maxv, math.ldexp(1.0, emin), has_inf, keep_sub


@njit(cache=True, inline="always")
def _slot_params(fp, slot):
    return round_limits(int(fp[slot, F_PRECISION]), int(fp[slot, F_EMIN]), fp[slot, F_MAX],
                        fp[slot, F_HAS_INF] != 0.0, fp[slot, F_KEEP_SUB] != 0.0)


@njit(cache=True, parallel=True)
def reduce_gemm_fast(a, w, fp, ic, seed, out, col0):
    """`reduce_gemm` for sequential models: out[m, col0 + n] = seq-sum_k a[m, k] * w[k, n].

    w is (K, N) C-contiguous; the N running sums of one row of `a` are updated
    together, channel by channel.
    """
    m_count, k_count = a.shape
    n_count = w.shape[1]
    width = out.shape[1]
    mode = ic[IC_MODE]
    sat = ic[IC_SAT] != 0
    rbits = ic[IC_RBITS]
    pp, p_elow, p_max, p_tiny, p_inf, p_keep = _slot_params(fp, PRODUCT)
    ap, a_elow, a_max, a_tiny, a_inf, a_keep = _slot_params(fp, ADDITION)
    cp, c_elow, c_max, c_tiny, c_inf, c_keep = _slot_params(fp, ACCUMULATOR)
    prod_round = pp != 0 and pp <= 51
    add_kind = 0 if ap == 0 else (2 if ap == 53 else 1)
    acc64 = cp == 53
    for m in prange(m_count):
        s = np.zeros(n_count)
        keys = np.empty(n_count, dtype=np.uint64)  # each output's random stream, once
        if mode == STOCHASTIC:
            for n in range(n_count):
                keys[n] = stream_key(seed, m * width + col0 + n)
        for k in range(k_count):
            av = a[m, k]
            for n in range(n_count):
                pv = av * w[k, n]
                if prod_round:
                    pv = fast_round(pv, pp, p_elow, p_max, p_tiny, p_inf, p_keep,
                                    NEAREST_EVEN, sat, 0, rbits)
                sv = s[n]
                if acc64:
                    t = sv + pv
                    if sat and math.isinf(t) and math.isfinite(sv) and math.isfinite(pv):
                        t = math.copysign(c_max, t)
                    s[n] = t
                    continue
                if add_kind == 0:
                    t = add_odd(sv, pv)
                elif add_kind == 2:
                    t = sv + pv
                else:
                    t = fast_round(add_odd(sv, pv), ap, a_elow, a_max, a_tiny, a_inf,
                                   a_keep, NEAREST_EVEN, sat, 0, rbits)
                r = 0
                if mode == STOCHASTIC:
                    r = stream_bits(keys[n], k, rbits)
                s[n] = fast_round(t, cp, c_elow, c_max, c_tiny, c_inf, c_keep,
                                  mode, sat, r, rbits)
        for n in range(n_count):
            r = stream_bits(keys[n], k_count, rbits) if mode == STOCHASTIC else 0
            out[m, col0 + n] = round_slot(s[n], fp, OUTPUT, mode, sat, r, rbits)


@njit(cache=True, parallel=True)
def reduce_gemm_seq_nearest(a, w, p, emin, maxv, out, col0):
    """Specialised `reduce_gemm_fast`: exact products, exact additions, nearest-even,
    subnormals kept, overflow to inf, output = accumulator (precision p <= 51).

    Branch-free per term; values that are inf or NaN go through the general
    rounding (they are rare and sticky)."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    emin_b = emin + 1023
    shift_p = p - 1
    maxbits = f2i(maxv)
    for m in prange(m_count):
        s = np.zeros(n_count)
        for k in range(k_count):
            av = a[m, k]
            for n in range(n_count):
                sv = s[n]
                pv = av * w[k, n]
                t = sv + pv
                bb = t - sv
                err = (sv - (t - bb)) + (pv - bb)
                b = f2i(t)
                inex = np.int64(err != 0.0)
                opp = np.int64((b < 0) != (err < 0.0)) & inex
                b = (b - opp) | inex
                e = (b >> 52) & 0x7FF
                eb = max(e, emin_b)
                c = i2f(((eb - shift_p + 52) << 52) | (1 << 51))
                x = i2f(b)
                yb = f2i((x + c) - c) | (b & _SIGN)
                mag = yb & ~_SIGN
                big = mag > maxbits
                yb = ((yb & _SIGN) | 0x7FF0000000000000) if big else yb
                s[n] = i2f(yb) if e != 0x7FF else t
        for n in range(n_count):
            out[m, col0 + n] = s[n]


_FP16_EMIN, _FP16_P, _FP16_MAX, _FP16_TINY = FP16.emin, FP16.precision, float(FP16.max), float(FP16.tiny)


@njit(cache=True, parallel=True)
def reduce_gemm_fp16_direct(a, w, keep_sub, add32, out, col0):
    """Sequential fp16 accumulation of fp16 (or fp8) products, nearest-even, overflow
    to inf: one float64 add and one rounding per term, no TwoSum. With `add32` each
    addition is the hardware float32 add (exact operands: s is fp16 and p has 22
    bits), then rounded to fp16 - the `addition=fp32` model, two roundings.

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
    m_count, k_count = a.shape
    n_count = w.shape[1]
    # float64 biased exponent below which the fp16 ulp stops shrinking: its emin, or for
    # a flushing accumulator emin - (precision + 1), low enough that nothing is clamped
    emin_b = _FP16_EMIN + 1023 if keep_sub else _FP16_EMIN + 1023 - (_FP16_P + 1)
    maxbits = f2i(_FP16_MAX)
    tiny = _FP16_TINY
    for m in prange(m_count):
        s = np.zeros(n_count)
        for k in range(k_count):
            av = a[m, k]
            for n in range(n_count):
                if add32:
                    t = np.float64(np.float32(s[n]) + np.float32(av * w[k, n]))
                else:
                    t = s[n] + av * w[k, n]
                b = f2i(t)
                e = (b >> 52) & 0x7FF
                eb = max(e, emin_b)
                c = i2f(((eb - 10 + 52) << 52) | (1 << 51))
                yb = f2i((t + c) - c) | (b & _SIGN)
                big = (yb & ~_SIGN) > maxbits
                yb = ((yb & _SIGN) | 0x7FF0000000000000) if big else yb
                y = i2f(yb)
                if not keep_sub:
                    y = math.copysign(0.0, y) if abs(y) < tiny else y
                s[n] = y if e != 0x7FF else t
        for n in range(n_count):
            out[m, col0 + n] = s[n]


_LOW_BITS = 48  # fp16 (and fp8) products are multiples of 2**-48 (2**-24 squared)
_RENORMALISE = 1 << 14  # terms between carries of the low word: 2**14 * 2**48 < 2**63


@njit(cache=True, inline="always")
def _carry(high, low):
    """(high, low) with low reduced to [0, 2**48): the same value high + low * 2**-48."""
    c = low >> _LOW_BITS
    return high + c, low - (c << _LOW_BITS)


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


@njit(cache=True, parallel=True)
def reduce_gemm_exact_fp16(a, w, fp, ic, seed, out, col0):
    """The exact model (one rounding of the exact sum) for fp16 or fp8 inputs: each product
    p = a * w (exact in float64, a multiple of 2**-48 below 2**32) splits into its integer
    part and its fraction scaled by 2**48, both exact int64s, summed in two int64 words -
    a 128-bit fixed-point accumulator in two vector-friendly adds, in place of the
    general kernel's long accumulator (`superacc_add`). Outputs with an inf or NaN product
    take the IEEE rule of the general kernel."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    width = out.shape[1]
    mode = ic[IC_MODE]
    sat = ic[IC_SAT] != 0
    rbits = ic[IC_RBITS]
    scale = float(np.int64(1) << _LOW_BITS)
    for m in prange(m_count):
        high = np.zeros(n_count, dtype=np.int64)
        low = np.zeros(n_count, dtype=np.int64)
        check = np.zeros(n_count)  # NaN once any product is inf or NaN
        for k in range(k_count):
            av = a[m, k]
            for n in range(n_count):
                p = av * w[k, n]
                whole = np.trunc(p)
                high[n] += np.int64(whole) if math.isfinite(p) else 0
                low[n] += np.int64((p - whole) * scale) if math.isfinite(p) else 0
                check[n] += p * 0.0
            if (k + 1) % _RENORMALISE == 0:
                for n in range(n_count):
                    high[n], low[n] = _carry(high[n], low[n])
        for n in range(n_count):
            index = m * width + col0 + n
            r0 = random_bits(seed, index, 0, rbits) if mode == STOCHASTIC else 0
            r1 = random_bits(seed, index, 1, rbits) if mode == STOCHASTIC else 0
            if check[n] == check[n]:
                h, lo = _carry(high[n], low[n])
                s = _round_fixed(h, lo, fp, mode, sat, r0, rbits)
            else:
                s = _ieee_sum_of_specials(a, w, m, n)
            out[m, col0 + n] = round_slot(s, fp, OUTPUT, mode, sat, r1, rbits)


@njit(cache=True)
def _ieee_sum_of_specials(a, w, m, n):
    """The exact model's result when some product is inf or NaN: NaN for a NaN or for
    infinities of both signs, else the infinity's sign (as `reduce_one`)."""
    pinf = ninf = nan = False
    for k in range(a.shape[1]):
        p = a[m, k] * w[k, n]
        nan |= p != p
        pinf |= p == math.inf
        ninf |= p == -math.inf
    if nan or (pinf and ninf):
        return math.nan
    return math.inf if pinf else -math.inf
