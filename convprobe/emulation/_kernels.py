"""Compiled (numba) arithmetic of the emulator: one rounding routine, the scalar models.

Everything here works on float64 carriers. Why it is exact:

* A product of two values with at most 26 significand bits (fp8/fp16/bf16/fp32
  inputs) is exact in float64; `convprobe.emulation.models` checks fp64 inputs.
* A sum ``s + p`` is formed with TwoSum and turned into its round-to-odd
  float64 value; rounding that once more to any format with precision <= 51
  gives the correctly rounded sum in every rounding mode (Boldo & Melquiond,
  "Emulation of FMA and correctly rounded sums: proved algorithms using rounding
  to odd", IEEE Trans. Computers 57(4), 2008). fp64 accumulators use the native
  add (nearest) or TwoSum with a one-ulp correction (toward zero).
* The exact model sums products in a Kulisch-style long accumulator of 32-bit
  limbs (Kulisch & Miranker 1981) and rounds once.

`round_parts` is the single rounding routine; every other rounding goes through
it, so the oracle (`convprobe.emulation.oracle`) checks one definition.

Model configuration travels as two small arrays built by `models.kernel_config`:
``fp[slot, F_*]`` (columns F_PRECISION, F_EMIN, F_MAX, F_HAS_INF, F_KEEP_SUB) for the
slots below (precision 0 means "exact, no rounding"), and ``ic`` with the integers
named by the ``IC_*`` constants.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

from convprobe.emulation import _native_fp16
from convprobe.formats import FP16, FP32

# format slots (rows) of the fp table
PRODUCT, ADDITION, ACCUMULATOR, OUTPUT, TOTAL = 0, 1, 2, 3, 4
# its columns: a format's precision (0: exact), emin, largest finite value, whether it has
# infinities, whether it keeps subnormals (1.0 / 0.0); `rounding.format_row` fills them
F_PRECISION, F_EMIN, F_MAX, F_HAS_INF, F_KEEP_SUB = 0, 1, 2, 3, 4
F_SIZE = 5
# integer configuration
IC_KIND, IC_MODE, IC_SAT, IC_RBITS, IC_CHUNK = 0, 1, 2, 3, 4
IC_SIZE = 5
# model kinds (block-FMA models run in `_block_fma`, composites in `composites`)
SEQUENTIAL, PAIRWISE, CHUNKED, EXACT = 0, 1, 3, 4
# rounding modes
NEAREST_EVEN, TOWARD_ZERO, STOCHASTIC = 0, 1, 2

_MASK52 = (1 << 52) - 1
_SIGN = -(1 << 63)
_M32 = 0xFFFFFFFF
# long accumulator: bit 0 of limb 0 weighs 2**-1074; products of float64 values
# that are exact in float64 lie in [2**-1074, 2**1024) and 72 limbs leave
# room for the carries of any realistic K.
_NLIMBS = 72


@intrinsic
def f2i(typingctx, x):
    """Reinterpret a float64 as int64 (bitcast)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def i2f(typingctx, x):
    """Reinterpret an int64 as float64 (bitcast)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@njit(cache=True, inline="always")
def bitlen(x):
    """Number of bits of a positive int64."""
    n = 0
    if x >> 32:
        n += 32
        x >>= 32
    if x >> 16:
        n += 16
        x >>= 16
    if x >> 8:
        n += 8
        x >>= 8
    if x >> 4:
        n += 4
        x >>= 4
    if x >> 2:
        n += 2
        x >>= 2
    if x >> 1:
        n += 1
        x >>= 1
    return n + x


@njit(cache=True, inline="always")
def splitmix64(z):
    """SplitMix64 finaliser (Steele, Lea & Flood, OOPSLA 2014) on uint64."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def stream_key(seed, index):
    """The key of output `index`'s random stream (see `random_bits`)."""
    return splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(index)))


@njit(cache=True, inline="always")
def stream_bits(key, event, rbits):
    """The rbits-bit random integer of event `event` in the stream with this key."""
    z = splitmix64(key + np.uint64(event))
    return np.int64(z >> np.uint64(64 - rbits))


@njit(cache=True, inline="always")
def random_bits(seed, index, event, rbits):
    """The rbits-bit random integer of stochastic rounding event `event` of output `index`.

    Counter-based, so the same (seed, output, event) always gives the same bits,
    whatever the traversal order or threading.
    """
    return stream_bits(stream_key(seed, index), event, rbits)


@njit(cache=True)
def round_parts(neg, mant, lsb, sticky, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits):
    """Round (-1)**neg * (mant + f) * 2**lsb (0 <= f < 1, f > 0 iff sticky) to a format.

    mant < 2**63. Precision p, smallest normal exponent emin, largest finite
    `maxv`. Subnormals kept, or flushed after rounding (a nonzero result below
    2**emin becomes a signed zero). Overflow: a result that exceeds `maxv`
    after rounding with unbounded exponent becomes inf (NaN without inf) in every
    rounding mode, or saturates to `maxv`. Stochastic rounding rounds away from
    zero iff floor(f * 2**rbits) + r >= 2**rbits, where f is the fraction of an
    ulp being discarded and r the random integer.
    """
    if mant == 0:
        return -0.0 if neg else 0.0
    e = lsb + bitlen(mant) - 1
    if keep_sub and e < emin:
        q = emin - p + 1
    else:
        q = e - p + 1
    shift = q - lsb
    if shift <= 0:
        mag = math.ldexp(float(mant), lsb)
    else:
        up = 0
        if shift >= 64:
            kept = 0
            if mode == STOCHASTIC:
                d = shift - rbits
                t = mant >> d if d < 63 else 0
                up = 1 if t + r >= (1 << rbits) else 0
        else:
            kept = mant >> shift
            rem = mant & ((1 << shift) - 1)
            if mode == NEAREST_EVEN:
                half = 1 << (shift - 1)
                if rem > half or (rem == half and (sticky or (kept & 1))):
                    up = 1
            elif mode == STOCHASTIC:
                if shift >= rbits:
                    t = rem >> (shift - rbits)
                else:
                    t = rem << (rbits - shift)
                up = 1 if t + r >= (1 << rbits) else 0
        kept += up
        if kept == 0:
            return -0.0 if neg else 0.0
        mag = math.ldexp(float(kept), q)
    if not keep_sub and mag < math.ldexp(1.0, emin):
        return -0.0 if neg else 0.0
    if mag > maxv:
        if sat:
            mag = maxv
        elif has_inf:
            mag = math.inf
        else:
            return math.nan
    return -mag if neg else mag


@njit(cache=True)
def round_f64(x, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits):
    """Round the float64 value x (exactly as given) to a format; see `round_parts`."""
    if x != x:
        return x
    if math.isinf(x):
        if has_inf:
            return x
        return math.nan
    if x == 0.0:
        return x
    b = f2i(x)
    neg = b < 0
    ef = (b >> 52) & 0x7FF
    if ef == 0:
        mant = b & _MASK52
        lsb = -1074
    else:
        mant = (b & _MASK52) | (1 << 52)
        lsb = ef - 1075
    return round_parts(neg, mant, lsb, False, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits)


@njit(cache=True, inline="always")
def add_odd(x, y):
    """x + y rounded to odd in float64 (TwoSum, then fix the last bit)."""
    s = x + y
    if not math.isfinite(s):
        return s
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    if err != 0.0:
        b = f2i(s)
        if (b < 0) != (err < 0.0):
            b -= 1
        b |= 1
        s = i2f(b)
    return s


@njit(cache=True, inline="always")
def is_fp64(p, emin):
    return p == 53 and emin == -1022


@njit(cache=True)
def round_slot(x, fp, slot, mode, sat, r, rbits):
    """Round float64 x to the format in table row `slot` (identity for an exact slot)."""
    p = int(fp[slot, F_PRECISION])
    if p == 0:
        return x
    return round_f64(x, p, int(fp[slot, F_EMIN]), fp[slot, F_MAX], fp[slot, F_HAS_INF] != 0.0,
                     fp[slot, F_KEEP_SUB] != 0.0, mode, sat, r, rbits)


@njit(cache=True)
def add_slot(x, y, fp, slot, mode, sat, r, rbits):
    """x + y computed exactly and rounded once to the format in row `slot`."""
    p = int(fp[slot, F_PRECISION])
    if p == 0:
        return x + y  # exact slot: only used where the caller guarantees exactness
    emin = int(fp[slot, F_EMIN])
    if is_fp64(p, emin):
        s = x + y
        if mode == TOWARD_ZERO and math.isfinite(s):
            bb = s - x
            err = (x - (s - bb)) + (y - bb)
            if err != 0.0 and (s < 0.0) != (err < 0.0):
                s = i2f(f2i(s) - 1)
        elif mode == TOWARD_ZERO and math.isinf(s) and math.isfinite(x) and math.isfinite(y):
            # nearest overflowed; truncation overflows only if |x + y| >= 2**1024
            h = 0.5 * x + 0.5 * y  # exact halves: x, y are huge here
            hb = h - 0.5 * x
            herr = (0.5 * x - (h - hb)) + (0.5 * y - hb)
            if abs(h) < 2.0**1023 or (abs(h) == 2.0**1023 and (herr < 0.0) == (h > 0.0)
                                      and herr != 0.0):
                s = math.copysign(fp[slot, F_MAX], s)
        if sat and math.isinf(s) and math.isfinite(x) and math.isfinite(y):
            s = math.copysign(fp[slot, F_MAX], s)
        return s
    return round_f64(add_odd(x, y), p, emin, fp[slot, F_MAX], fp[slot, F_HAS_INF] != 0.0,
                     fp[slot, F_KEEP_SUB] != 0.0, mode, sat, r, rbits)


@njit(cache=True)
def accumulate(s, t, fp, mode, sat, rbits, seed, index, ev):
    """One accumulation step s + t -> accumulator, through the addition format if any."""
    r = random_bits(seed, index, ev, rbits) if mode == STOCHASTIC else 0
    if fp[ADDITION, F_PRECISION] != 0.0:
        s = add_slot(s, t, fp, ADDITION, NEAREST_EVEN, sat, 0, rbits)
        return round_slot(s, fp, ACCUMULATOR, mode, sat, r, rbits)
    return add_slot(s, t, fp, ACCUMULATOR, mode, sat, r, rbits)


@njit(cache=True, inline="always")
def product(a, b, fp, sat, rbits):
    p = a * b
    if fp[PRODUCT, F_PRECISION] != 0.0:
        p = round_slot(p, fp, PRODUCT, NEAREST_EVEN, sat, 0, rbits)
    return p


@njit(cache=True)
def superacc_add(limbs, v):
    """Add the finite float64 v exactly to the long accumulator."""
    if v == 0.0:
        return
    b = f2i(v)
    ef = (b >> 52) & 0x7FF
    if ef == 0:
        mant = b & _MASK52
        off = 0
    else:
        mant = (b & _MASK52) | (1 << 52)
        off = ef - 1
    i = off >> 5
    sh = off & 31
    lo = (mant & _M32) << sh
    hi = (mant >> 32) << sh
    w0 = lo & _M32
    w1 = (lo >> 32) + (hi & _M32)
    w2 = hi >> 32
    if b < 0:
        limbs[i] -= w0
        limbs[i + 1] -= w1
        limbs[i + 2] -= w2
    else:
        limbs[i] += w0
        limbs[i + 1] += w1
        limbs[i + 2] += w2


@njit(cache=True)
def superacc_round(limbs, fp, slot, mode, sat, r, rbits):
    """Round the long accumulator's exact value once to the format in row `slot`."""
    n = limbs.shape[0]
    for i in range(n - 1):
        c = limbs[i] >> 32
        limbs[i] -= c << 32
        limbs[i + 1] += c
    neg = limbs[n - 1] < 0
    if neg:
        for i in range(n):
            limbs[i] = -limbs[i]
        for i in range(n - 1):
            c = limbs[i] >> 32
            limbs[i] -= c << 32
            limbs[i + 1] += c
    h = n - 1
    while h >= 0 and limbs[h] == 0:
        h -= 1
    if h < 0:
        return 0.0
    mant = limbs[h]
    pos = 32 * h
    sticky = False
    j = h - 1
    while j >= 0:
        nb = bitlen(mant)
        if nb + 32 <= 63:
            mant = (mant << 32) | limbs[j]
            pos -= 32
            j -= 1
        else:
            need = 63 - nb
            mant = (mant << need) | (limbs[j] >> (32 - need))
            pos -= need
            if limbs[j] & ((1 << (32 - need)) - 1):
                sticky = True
            j -= 1
            while j >= 0:
                if limbs[j] != 0:
                    sticky = True
                j -= 1
    p = int(fp[slot, F_PRECISION])
    return round_parts(neg, mant, pos - 1074, sticky, p, int(fp[slot, F_EMIN]), fp[slot, F_MAX],
                       fp[slot, F_HAS_INF] != 0.0, fp[slot, F_KEEP_SUB] != 0.0, mode, sat, r, rbits)


@njit(cache=True)
def reduce_one(a, ia, b, ib, k, fp, ic, seed, index, scratch, limbs):
    """Reduce sum_j a[ia + j] * b[ib + j], j = 0..k-1, under the model in (fp, ic)."""
    kind = ic[IC_KIND]
    mode = ic[IC_MODE]
    sat = ic[IC_SAT] != 0
    rbits = ic[IC_RBITS]
    ev = 0
    if kind == SEQUENTIAL:
        s = 0.0
        for j in range(k):
            s = accumulate(s, product(a[ia + j], b[ib + j], fp, sat, rbits),
                           fp, mode, sat, rbits, seed, index, ev)
            ev += 1
    elif kind == PAIRWISE:
        if k == 0:
            s = 0.0
        else:
            for j in range(k):
                scratch[j] = product(a[ia + j], b[ib + j], fp, sat, rbits)
            n = k
            while n > 1:
                half = n // 2
                for j in range(half):
                    scratch[j] = accumulate(scratch[2 * j], scratch[2 * j + 1],
                                            fp, mode, sat, rbits, seed, index, ev)
                    ev += 1
                if n & 1:
                    scratch[half] = scratch[n - 1]
                n = half + (n & 1)
            s = scratch[0]
    elif kind == CHUNKED:
        total = 0.0
        low = 0.0
        chunk = ic[IC_CHUNK]
        c = 0
        for j in range(k):
            low = accumulate(low, product(a[ia + j], b[ib + j], fp, sat, rbits),
                             fp, mode, sat, rbits, seed, index, ev)
            ev += 1
            c += 1
            if c == chunk or j == k - 1:
                r = random_bits(seed, index, ev, rbits) if mode == STOCHASTIC else 0
                ev += 1
                total = add_slot(total, low, fp, TOTAL, mode, sat, r, rbits)
                low = 0.0
                c = 0
        s = total
    else:  # EXACT
        for i in range(limbs.shape[0]):
            limbs[i] = 0
        nan = False
        pinf = False
        ninf = False
        for j in range(k):
            p = product(a[ia + j], b[ib + j], fp, sat, rbits)
            if p != p:
                nan = True
            elif p == math.inf:
                pinf = True
            elif p == -math.inf:
                ninf = True
            else:
                superacc_add(limbs, p)
        if nan or (pinf and ninf):
            s = math.nan
        elif pinf:
            s = math.inf
        elif ninf:
            s = -math.inf
        else:
            r = random_bits(seed, index, ev, rbits) if mode == STOCHASTIC else 0
            ev += 1
            s = superacc_round(limbs, fp, ACCUMULATOR, mode, sat, r, rbits)
    r = random_bits(seed, index, ev, rbits) if mode == STOCHASTIC else 0
    return round_slot(s, fp, OUTPUT, mode, sat, r, rbits)


@njit(cache=True, parallel=True)
def reduce_pairs(a, b, fp, ic, seed, out):
    """out[m] = reduction of a[m, :] * b[m, :] (a, b C-contiguous (M, K))."""
    m_count, k = a.shape
    af = a.ravel()
    bf = b.ravel()
    for m in prange(m_count):
        scratch = np.empty(max(k, 1))
        limbs = np.zeros(_NLIMBS, dtype=np.int64)
        out[m] = reduce_one(af, m * k, bf, m * k, k, fp, ic, seed, m, scratch, limbs)


@njit(cache=True, parallel=True)
def reduce_gemm(a, bt, fp, ic, seed, out, col0):
    """out[m, col0 + n] = reduction of a[m, :] * bt[n, :] (a (M, K), bt (N, K), C-contiguous).

    The stochastic-rounding stream of output (m, col) is keyed by its flat index
    m * out.shape[1] + col, so grouped layers draw the same bits as one call.
    """
    m_count, k = a.shape
    n_count = bt.shape[0]
    width = out.shape[1]
    af = a.ravel()
    bf = bt.ravel()
    for m in prange(m_count):
        scratch = np.empty(max(k, 1))
        limbs = np.zeros(_NLIMBS, dtype=np.int64)
        for n in range(n_count):
            out[m, col0 + n] = reduce_one(af, m * k, bf, n * k, k, fp, ic, seed,
                                          m * width + col0 + n, scratch, limbs)


@njit(cache=True, parallel=True)
def round_array(x, out, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits):
    """Vectorised `round_f64` over flat arrays (r: one random integer per element)."""
    for i in prange(x.shape[0]):
        out[i] = round_f64(x[i], p, emin, maxv, has_inf, keep_sub, mode, sat, r[i], rbits)


# ---------------------------------------------------------------------------
# Fast path: sequential models, vectorised across output channels.
# ---------------------------------------------------------------------------


@njit(cache=True, inline="always")
def fast_round(x, p, elow, maxv, tiny, has_inf, keep_sub, mode, sat, r, rbits):
    """Branch-light `round_f64` for formats away from float64's underflow (see `fast_ok`).

    x must be exact or rounded to odd at >= p + 2 bits. Nearest-even adds and
    subtracts 1.5 * 2**(q + 52), which makes the FPU round at the quantum 2**q;
    toward-zero and stochastic clear the bits below 2**q. Same results as
    `round_f64` (tested), several times faster.
    """
    b = f2i(x)
    e = (b >> 52) & 0x7FF
    eb = e if e > elow else elow
    qb = eb - p + 1
    if mode == NEAREST_EVEN:
        c = i2f(((qb + 52) << 52) | (1 << 51))
        y = math.copysign((x + c) - c, x)
    else:
        e1 = e if e > 0 else 1
        raw = 52 - e1 + qb
        nclear = min(max(raw, 0), 63)
        mask = (1 << nclear) - 1
        if raw <= 52:
            tb = b & ~mask
        else:
            tb = b & _SIGN
        y = i2f(tb)
        if mode == STOCHASTIC:
            mant = (b & _MASK52) | ((1 << 52) if e > 0 else 0)
            frac = mant if raw >= 53 else mant & mask
            d = raw - rbits
            t = frac >> min(max(d, 0), 63) if d < 64 else 0
            if t + r >= (1 << rbits):
                y = y + math.copysign(i2f(qb << 52), x)
    if e == 0x7FF:
        y = x if (has_inf or x != x) else math.nan
    else:
        ay = abs(y)
        if ay > maxv:
            if sat:
                y = math.copysign(maxv, y)
            elif has_inf:
                y = math.copysign(math.inf, y)
            else:
                y = math.nan
        elif (not keep_sub) and ay < tiny:
            y = math.copysign(0.0, y)
    return y


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


@njit(cache=True, inline="always")
def _slot_params(fp, slot):
    p = int(fp[slot, F_PRECISION])
    emin_b = int(fp[slot, F_EMIN]) + 1023
    keep = fp[slot, F_KEEP_SUB] != 0.0
    elow = emin_b if keep else emin_b - p - 1
    return p, elow, fp[slot, F_MAX], math.ldexp(1.0, int(fp[slot, F_EMIN])), fp[slot, F_HAS_INF] != 0.0, keep


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


def _nearest_ok(fp, ic) -> bool:
    acc, out = fp[ACCUMULATOR], fp[OUTPUT]
    return (fp[PRODUCT, F_PRECISION] == 0.0 and fp[ADDITION, F_PRECISION] == 0.0 and ic[IC_MODE] == NEAREST_EVEN
            and ic[IC_SAT] == 0 and acc[F_HAS_INF] != 0.0 and acc[F_KEEP_SUB] != 0.0 and acc[F_PRECISION] <= 51
            and acc[F_EMIN] >= -900 and (acc == out).all())


def _same_format(row, fmt) -> bool:
    """Whether a format-table row is `fmt` (its subnormal handling aside)."""
    return ((row[F_PRECISION], row[F_EMIN], row[F_MAX], row[F_HAS_INF] != 0.0)
            == (fmt.precision, fmt.emin, fmt.max, fmt.has_inf))


def _fp16_direct_ok(fp, ic) -> bool:
    acc = fp[ACCUMULATOR]
    add_ok = fp[ADDITION, F_PRECISION] == 0.0 or _same_format(fp[ADDITION], FP32)
    return (ic[IC_KIND] == SEQUENTIAL and fp[PRODUCT, F_PRECISION] == 0.0 and add_ok
            and ic[IC_MODE] == NEAREST_EVEN and ic[IC_SAT] == 0
            and _same_format(acc, FP16) and (acc == fp[OUTPUT]).all())


def native_fp16(fp, ic, inputs_fp16) -> bool:
    """Whether `gemm` takes float16 arrays for this model and these inputs: the CPU's own
    fp16 FMA does the arithmetic (see `convprobe.emulation._native_fp16`)."""
    return inputs_fp16 and _fp16_direct_ok(fp, ic) and _native_fp16.available()


def gemm(a, w, fp, ic, seed, out, col0, inputs_fp16=False, *, fast=True):
    """out[:, col0:col0 + N] = modelled reductions of a (M, K) against w (K, N).

    `inputs_fp16`: every value of a and w is an fp16 (or fp8) value, which enables
    `reduce_gemm_fp16_direct`. float16 arrays (a, w and out, where `native_fp16` says
    so) go to the hardware fp16 kernel. `fast=False` takes the general kernel whatever
    the model (what the specialised kernels are tested against)."""
    if a.dtype == np.float16:
        _native_fp16.sequential_gemm(a, np.ascontiguousarray(w), out, col0,
                                     add32=fp[ADDITION, F_PRECISION] != 0.0, flush=fp[ACCUMULATOR, F_KEEP_SUB] == 0.0)
    elif fast and inputs_fp16 and _fp16_direct_ok(fp, ic):
        reduce_gemm_fp16_direct(a, np.ascontiguousarray(w), fp[ACCUMULATOR, F_KEEP_SUB] != 0.0,
                                fp[ADDITION, F_PRECISION] != 0.0, out, col0)
    elif fast and fast_ok(fp, ic) and _nearest_ok(fp, ic):
        acc = fp[ACCUMULATOR]
        reduce_gemm_seq_nearest(a, np.ascontiguousarray(w), int(acc[F_PRECISION]), int(acc[F_EMIN]), acc[F_MAX],
                                out, col0)
    elif fast and fast_ok(fp, ic):
        reduce_gemm_fast(a, np.ascontiguousarray(w), fp, ic, np.uint64(seed), out, col0)
    else:
        reduce_gemm(a, np.ascontiguousarray(w.T), fp, ic, np.uint64(seed), out, col0)
