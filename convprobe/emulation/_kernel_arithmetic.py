"""The emulator's compiled (numba) arithmetic that every kernel shares: one rounding routine.

One file, over 600 lines: its inlined helpers call one another, and every compiled kernel
inlines them from here (a kernel's numba cache follows its own file, not these).

The rounding works on float64 carriers (the 32-bit bitcasts and `bitlen32` serve the
32-bit-lane kernels). Why it is exact:

* A product of two values with at most 26 significand bits (fp8/fp16/bf16/fp32
  inputs) is exact in float64; `convprobe.emulation.models` checks fp64 inputs.
* A sum ``s + p`` is formed with TwoSum and turned into its round-to-odd
  float64 value; rounding that once more to any format with precision <= 51
  gives the correctly rounded sum in every rounding mode (Boldo & Melquiond,
  "Emulation of FMA and correctly rounded sums: proved algorithms using rounding
  to odd", IEEE Trans. Computers 57(4), 2008). fp64 accumulators use the native
  add (nearest) or TwoSum with a one-ulp correction (toward zero).
* The exact model sums products in a Kulisch-style long accumulator of 32-bit
  limbs (Kulisch & Miranker 1981) and rounds once; on fp16 inputs the fast kernel
  splits each product into two float64 sums that stay exact over a block, folded into
  a two-word int64 fixed point past one block (`_kernels_fast.reduce_gemm_exact_fp16`).

`round_parts` is the single rounding routine; `round_f64` and the slot helpers go
through it, so the oracle (`convprobe.emulation.oracle`) checks one definition. The
kernels that use it live by role: `_kernels_reference` (the general kernels, any
model), `_kernels_fast` (specialised sequential kernels, tested against them),
`_native_fp16` and `_native_fp32` (the CPU's own fp16 and float32 arithmetic),
`_native_stochastic` (stochastically rounded fp16 sums in float32 lanes), and
`_kernels` (which one runs); the block-FMA kernels are `_block_fma*`. Kernels may read fp16
bit patterns (float16 carriers) through `load_f64` and write them through `store_f64`.

Model configuration travels as two small arrays built by `models.kernel_config`:
``fp[slot, F_*]`` (columns F_PRECISION, F_EMIN, F_MAX, F_HAS_INF, F_KEEP_SUB) for the
slots below (precision 0 means "exact, no rounding"), and ``ic`` with the integers
named by the ``IC_*`` constants.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from convprobe.random_stream import LOWBIAS32, WEYL32

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
#: The exponent of a zero addend in the block-FMA kernels: below every other, and a sum of
#: two of them stays below half of it.
NO_EXPONENT = np.iinfo(np.int64).min // 4

_MASK52 = (1 << 52) - 1
#: -0.0's bits as a signed int64.
_NEGATIVE_ZERO_BITS = -(1 << 63)
_WEYL32 = np.uint32(WEYL32)
_LOWBIAS_A, _LOWBIAS_B = (np.uint32(m) for m in LOWBIAS32)
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


@intrinsic
def f2i32(typingctx, x):
    """Reinterpret a float32 as int32 (bitcast)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def i2f32(typingctx, x):
    """Reinterpret an int32 as float32 (bitcast)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def bitlen32(typingctx, x):
    """Number of bits of a non-negative int32 (0 for 0): 32 minus LLVM's ctlz, which
    vectorises (vplzcntd where the CPU has it)."""
    sig = types.int32(types.int32)

    def codegen(context, builder, signature, args):
        zeros = builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))
        return builder.sub(ir.Constant(ir.IntType(32), 32), zeros)

    return sig, codegen


@intrinsic
def widen(typingctx, x):
    """The float32 value of an fp16 bit pattern (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def narrow(typingctx, x):
    """A float32 rounded to fp16 (nearest even, overflow to inf), as its bit pattern."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def prefer_512_bit_vectors(typingctx):
    """Ask LLVM to vectorise the calling kernel in 512-bit registers where the CPU has them.

    Why: LLVM's tuning for Intel's AVX-512 server cores (Skylake-SP to Emerald Rapids) prefers
    256-bit vectors, to spare the clock drop of 512-bit ones; for these long vector loops of
    emulated arithmetic the wider lanes win (the plan kernel ran 1.6x faster with them on an
    Emerald Rapids Xeon, `benchmarks/bench_emulation.py`). Zen 4's tuning picks them anyway.
    It sets the function attribute clang's ``-mprefer-vector-width=512`` sets, on this kernel
    alone (numba's global NUMBA_CPU_FEATURES would change every user's function too)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        # (llvmlite's FunctionAttributes knows keyword attributes only; a string attribute is
        # added to its underlying set, which prints it as it is)
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return sig, codegen


def load_f64(x):
    """A carrier's element as float64: itself, or the value of an fp16 bit pattern (uint16,
    the float16 carrier's view) widened by the hardware (exact; F16C, which the callers
    check: `_native_fp16.available(fma=False)`). For njit code."""
    return np.float64(x)


@overload(load_f64, inline="always")
def _load_f64(x):
    if x == types.uint16:
        return lambda x: np.float64(widen(x))
    return lambda x: np.float64(x)


def store_f64(out, v):
    """v (a float64) as an element of `out`: itself, or for a uint16 (fp16 bit pattern)
    array, v rounded to fp16 (exact where v is an fp16 value already). For njit code."""
    return v


@overload(store_f64, inline="always")
def _store_f64(out, v):
    if out.dtype == types.uint16:
        return lambda out, v: narrow(np.float32(v))
    return lambda out, v: v


def same_format(row, fmt) -> bool:
    """Whether a format-table row is `fmt` (its subnormal handling aside)."""
    return ((row[F_PRECISION], row[F_EMIN], row[F_MAX], row[F_HAS_INF] != 0.0)
            == (fmt.precision, fmt.emin, fmt.max, fmt.has_inf))


@njit(cache=True, inline="always")
def add_fp32(total, v):
    """total (a float32) + v (a float64 holding at most 53 bits) rounded once to float32,
    nearest even: the exact sum rounded to odd in float64, then to float32 (Boldo &
    Melquiond; 53 >= 24 + 2). How chunked models fold an fp16 chunk sum into an fp32 total."""
    return np.float32(add_odd(np.float64(total), v))


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
def hash32(x):
    """lowbias32 (Wellons 2018) on a uint32, every step kept in 32 bits so loops over
    outputs vectorise in 32-bit lanes."""
    x = np.uint32(x ^ np.uint32(x >> np.uint32(16)))
    x = np.uint32(x * _LOWBIAS_A)
    x = np.uint32(x ^ np.uint32(x >> np.uint32(15)))
    x = np.uint32(x * _LOWBIAS_B)
    return np.uint32(x ^ np.uint32(x >> np.uint32(16)))


@njit(cache=True, inline="always")
def stream_key(seed, index):
    """The 32-bit key of output `index`'s random stream (`convprobe.random_stream`)."""
    return np.uint32(splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(index))) >> np.uint64(32))


@njit(cache=True, inline="always")
def weyl(event):
    """Event `event`'s step of the stream's Weyl sequence, event * WEYL32 mod 2**32."""
    return np.uint32(np.uint32(event) * _WEYL32)


@njit(cache=True, inline="always")
def stream_word(key, step):
    """The 32 random bits of the event whose Weyl step is `step`, in the stream with this key."""
    return hash32(np.uint32(key + step))


@njit(cache=True, inline="always")
def stream_bits(key, event, rbits):
    """The rbits-bit random integer of event `event` in the stream with this key."""
    return np.int64(stream_word(key, weyl(event)) >> np.uint32(32 - rbits))


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
    b = f2i(x)
    # A zero, told by its two bit patterns: a thread that treats float64 subnormals as zero (DAZ,
    # as TensorFlow's threads do) takes one for 0.0 in a float comparison, and LLVM folds a
    # masked test of the bits back into one.
    if b == 0 or b == _NEGATIVE_ZERO_BITS:
        return x
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
    """x + y rounded to odd in float64 (TwoSum, then fix the last bit); branch-free, so
    loops over outputs vectorise. A non-finite sum is returned as it is."""
    s = x + y
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    b = f2i(s)
    toward = (b ^ f2i(err)) >> 63  # -1 where err and s differ in sign: step s toward zero
    odd = i2f((b + toward) | 1)
    return odd if ((err != 0.0) & (abs(s) < math.inf)) else s


@njit(cache=True, inline="always")
def add_odd32(x, y):
    """x + y rounded to odd in float32: `add_odd`'s twin in 32-bit lanes (TwoSum's error is
    exact in float32 too, short of overflow), every integer an int32 so lanes stay narrow.
    Rounded to nearest (MXCSR's default); callers keep far above float32's subnormals
    (fp16 products are at least 2**-48)."""
    s = x + y
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    b = f2i32(s)
    toward = np.int32((b ^ f2i32(err)) >> np.int32(31))  # -1 where err and s differ in sign
    odd = i2f32(np.int32(np.int32(b + toward) | np.int32(1)))
    return odd if ((err != np.float32(0.0)) & (abs(s) < np.float32(math.inf))) else s


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


TILE = 64  # rows of `a` per task in the row-tiled kernels: a (K, 64) float64 tile fits in L2


@njit(cache=True, inline="always")
def load_tile(a, m0, rows, at):
    """at[j, i] = a[m0 + i, j] for the tile's rows (the rest of `at` untouched; a may hold
    fp16 bit patterns, `load_f64`; at float64 or float32, which holds every value a kernel
    puts there exactly). The row-tiled kernels then run their inner loops over the tile's
    rows - unit-stride, independent, vectorised. Eight rows of `a` are read across at a
    time, so each store fills eight adjacent lanes: a loop over j alone compiles to scatter
    stores, and over i alone to strided loads, both several times slower."""
    whole = rows - rows % 8
    for i0 in range(0, whole, 8):
        for j in range(a.shape[1]):
            for i in range(i0, i0 + 8):
                at[j, i] = load_f64(a[m0 + i, j])
    for i in range(whole, rows):
        for j in range(a.shape[1]):
            at[j, i] = load_f64(a[m0 + i, j])


@njit(cache=True, inline="always")
def row_tile(a, t):
    """Tile t of a's rows for the row-tiled kernels: (its first row, its row count, its rows
    transposed into a zero-padded (K, TILE) float64 array by `load_tile`)."""
    m0 = t * TILE
    rows = min(TILE, a.shape[0] - m0)
    at = np.zeros((a.shape[1], TILE))
    load_tile(a, m0, rows, at)
    return m0, rows, at


@njit(cache=True, inline="always")
def special_sum(nan, pinf, ninf):
    """The exact sum of terms among which some are inf or NaN (the flags say which): NaN
    for a NaN or for infinities of both signs, else the infinity's sign."""
    if nan or (pinf and ninf):
        return math.nan
    return math.inf if pinf else -math.inf


def _llvm_fma(ty, name):
    """Code generation of a call to LLVM's fused multiply-add `name` on type `ty`."""
    def codegen(context, builder, signature, args):
        return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name), args)

    return codegen


@intrinsic
def fma_fp32(typingctx, a, b, c):
    """a * b + c in float32, one rounding (in the rounding mode MXCSR sets): `llvm.fma.f32`,
    a single instruction where the CPU has FMA, the C library's `fmaf` elsewhere, never a
    multiply and an add."""
    return types.float32(types.float32, types.float32, types.float32), _llvm_fma(ir.FloatType(), "llvm.fma.f32")


@intrinsic
def fma_fp64(typingctx, a, b, c):
    """a * b + c in float64, one rounding (`llvm.fma.f64`, as `fma_fp32`)."""
    return types.float64(types.float64, types.float64, types.float64), _llvm_fma(ir.DoubleType(), "llvm.fma.f64")
