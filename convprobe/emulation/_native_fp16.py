"""Sequential fp16 accumulation on the CPU's own arithmetic: the fp16 fused multiply-add
where it has one (AVX512-FP16), else float32 arithmetic with F16C's fp16 conversions.

Why this is exact: the default sequential fp16 model computes
s_{k+1} = fp16(s_k + a_k * b_k) with the product exact and one rounding per step,
nearest-even, subnormals kept, overflow to inf. For fp16 (or fp8) inputs that is,
operation for operation, the IEEE 754 fusedMultiplyAdd in binary16, which CPUs with
AVX512-FP16 (Intel Sapphire Rapids and later) execute 32 lanes at a time
(``vfmadd231ph``). The ``addition=fp32`` variant (CPU half arithmetic: product and sum
in float32, rounded back to fp16) is a float32 multiply (exact: at most 22 bits), a
float32 add and one float32 -> fp16 conversion, none of them fused.

Where the CPU lacks AVX512-FP16, LLVM would widen an fp16 FMA to a float32 FMA and
round twice, which is NOT exact (1 + 2**-11 + 2**-32 rounds to 1 + 2**-11 in float32,
then ties to 1 in fp16; the correct result is 1 + 2**-10). So `available()` gates
the fp16 FMA on the instruction; without it each step is the exact sum rounded to odd
in float32 (TwoSum) and then to fp16 by F16C's conversion, which rounds once in effect
(`_step`). The ``addition=fp32`` kernel needs no fp16 arithmetic at all, only the
conversions, which F16C (every x86-64 CPU with AVX2, AMD's included) does in hardware,
correctly rounded (``vcvtps2ph``, nearest even under the default MXCSR, subnormals and
overflow to inf as IEEE says): `available(fma=False)`. The tests compare both paths bit
for bit where the instructions exist.

The sequential fp16 model rounded toward zero runs here too, with each task's MXCSR set
to toward zero (IEEE rounding control, which the fp16 FMA honours) and put back after;
where the model overflows to inf and IEEE truncation stops at 65504, a float32 FMA of the
same operands marks the lane (`_step`). Without the fp16 FMA, that float32 FMA and F16C's
conversion, both truncating under MXCSR, give the truncated sum (truncating to float32
and then to fp16 is truncating to fp16), and the same mark its overflow: F16C only.

The chunked model with an fp16 accumulator, an fp32 total and fp16 output runs here too:
each chunk's fp16 sum is this FMA chain from +0, folded into the fp32 total by one
round-to-odd float64 addition and one float32 rounding (Boldo & Melquiond's argument, as
in `_kernel_arithmetic`), and the total meets the hardware's fp32 -> fp16 conversion; or
the total is stored as it is (`chunked_gemm_fp32_total`: split-K of the sequential fp16
model, its partial results summed in fp32).

Each parallel task runs four rows together so that four independent FMA chains hide
the instruction's latency; LLVM vectorises the loop over output channels.
"""

from __future__ import annotations

import functools
import os

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from convprobe.emulation._kernel_arithmetic import add_fp32, add_odd32, fma_fp32, load_f64, narrow, store_f64, widen
from convprobe.emulation._threads import over_tasks

__all__ = ["available", "chunked_gemm_fp32_total", "convert", "sequential_gemm", "use_fp16_fma"]

_ROWS = 4  # rows per task: independent accumulation chains
_MXCSR_TOWARD_ZERO = 0x6000  # MXCSR rounding control bits 13-14: 11 is toward zero
_FP16_OVERFLOW = np.float32(65536.0)  # where truncation to fp16 leaves the finite range (2**16)


def available(fma: bool = True) -> bool:
    """Whether the host CPU runs these kernels (and CONVPROBE_NATIVE_FP16 is not "0"): the
    fp16 FMA needs AVX512-FP16; the float32 ones (`fma=False`: addition=fp32, nearest even
    and toward zero without the fp16 FMA) F16C's conversions."""
    return (os.environ.get("CONVPROBE_NATIVE_FP16", "1") != "0"
            and _host_has("avx512fp16" if fma else "f16c"))


@functools.cache
def _host_has(feature: str) -> bool:
    import llvmlite.binding as llvm  # noqa: PLC0415 - only when asked

    return bool(llvm.get_host_cpu_features().get(feature, False))


def _half_args(builder, args):
    return [builder.bitcast(v, ir.HalfType()) for v in args]


@intrinsic
def fma_fp16(typingctx, a, b, s):
    """fp16(a * b + s), one rounding, on fp16 bit patterns (uint16)."""
    sig = types.uint16(types.uint16, types.uint16, types.uint16)

    def codegen(context, builder, signature, args):
        half = ir.HalfType()
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(half, [half, half, half]), "llvm.fma.f16")
        return builder.bitcast(builder.call(fma, _half_args(builder, args)), ir.IntType(16))

    return sig, codegen


@intrinsic
def mul_add_fp32_fp16(typingctx, a, b, s):
    """fp16(fp32(fp32(a) * fp32(b) + fp32(s))) on fp16 bit patterns: two roundings."""
    sig = types.uint16(types.uint16, types.uint16, types.uint16)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        x, y, z = (builder.fpext(v, f32) for v in _half_args(builder, args))
        t = builder.fadd(builder.fmul(x, y), z)
        return builder.bitcast(builder.fptrunc(t, ir.HalfType()), ir.IntType(16))

    return sig, codegen


def _mxcsr_calls(builder):
    i8p = ir.IntType(8).as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [i8p])
    return (cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.stmxcsr"),
            cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.ldmxcsr"), i8p)


@intrinsic
def round_toward_zero(typingctx):
    """Set this thread's SSE rounding control (MXCSR) to toward zero; returns the old MXCSR
    for `restore_mxcsr`. The fp16 and float32 instructions then round toward zero."""
    sig = types.int32()

    def codegen(context, builder, signature, args):
        store, load, i8p = _mxcsr_calls(builder)
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.call(store, [builder.bitcast(slot, i8p)])
        old = builder.load(slot)
        builder.store(builder.or_(old, ir.Constant(ir.IntType(32), _MXCSR_TOWARD_ZERO)), slot)
        builder.call(load, [builder.bitcast(slot, i8p)])
        return old

    return sig, codegen


@intrinsic
def restore_mxcsr(typingctx, value):
    """Load a saved MXCSR (from `round_toward_zero`)."""
    sig = types.void(types.int32)

    def codegen(context, builder, signature, args):
        _, load, i8p = _mxcsr_calls(builder)
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.store(args[0], slot)
        builder.call(load, [builder.bitcast(slot, i8p)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def _flushed(r):
    """A subnormal fp16 result (exponent field 0) as a zero of its sign."""
    return r & 0x8000 if (r & 0x7C00) == 0 else r


@njit(cache=True, inline="always")
def _step(av, wv, sv, add32, flush, rz, float32_only):
    """One accumulation step; `add32`, `flush`, `rz` and `float32_only` are constants in each of
    the kernels below, so the branches fold away. (Passing a step function as an argument
    instead makes the dispatcher part of the cache key, which numba cannot pickle.)

    `rz` (MXCSR set to toward zero): the FMA truncates, as the model does, except that
    IEEE gives the largest finite value where the model overflows to inf (at every
    |exact sum| >= 65536); the float32 FMA of the same operands, truncated too, is at
    least 65536 exactly then, and marks those lanes.

    `float32_only`: no fp16 FMA, F16C's conversions and float32 arithmetic only. Toward zero, the
    float32 FMA truncated to fp16 by the conversion (which follows MXCSR) is the result:
    truncation to float32, then to fp16, is truncation to fp16, every fp16 value being a
    float32 one. Nearest even does not nest so: the exact sum s + p (p = a * b, exact in
    float32) is rounded to odd in float32 (`add_odd32`), then to fp16 by the conversion;
    24 bits >= 11 + 2, so that is the sum rounded once (Boldo & Melquiond)."""
    if rz:
        t = fma_fp32(widen(av), widen(wv), widen(sv))
        r = narrow(t) if float32_only else fma_fp16(av, wv, sv)
        r = ((r & 0x8000) | 0x7C00) if abs(t) >= _FP16_OVERFLOW else r
    elif float32_only and not add32:
        r = narrow(add_odd32(widen(av) * widen(wv), widen(sv)))
    else:
        r = mul_add_fp32_fp16(av, wv, sv) if add32 else fma_fp16(av, wv, sv)
    return _flushed(r) if flush else r


@njit(cache=True, inline="always")
def _fold(total, s):
    """total (fp32) + the fp16 chunk sum s, rounded once to fp32, nearest even: the exact
    sum rounded to odd in float64 (`add_odd`), then to float32; s restarts from +0."""
    for n in range(total.shape[0]):
        total[n] = add_fp32(total[n], float(widen(s[n])))
        s[n] = 0


@njit(cache=True, inline="always")
def _store(out, m, col0, s, total, chunk):
    """Row m of the results: the fp16 sums, or the fp32 chunk totals as `out` holds them
    (`store_f64`: rounded to fp16 in fp16 bit patterns, themselves in a float32 `out`)."""
    for n in range(s.shape[0]):
        out[m, col0 + n] = store_f64(out, float(total[n])) if chunk else s[n]


@njit(cache=True, inline="always")
def _gemm(t0, t1, a, w, out, col0, add32, flush, rz, float32_only, chunk):
    """Tasks t0 .. t1 - 1 (four rows each) of `sequential_gemm`. chunk = 0: one fp16 sum
    per output; chunk > 0: fp16 sums of `chunk` terms (from +0)
    folded into an fp32 total (`_fold`), which an fp16 `out` rounds to fp16 and a float32
    `out` keeps (`_store`). `rz`: each task rounds toward zero (MXCSR), and puts the
    thread's rounding mode back at its end."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    for t in range(t0, t1):
        m0 = t * _ROWS
        if m0 + _ROWS <= m_count:
            s0 = np.zeros(n_count, np.uint16)
            s1 = np.zeros(n_count, np.uint16)
            s2 = np.zeros(n_count, np.uint16)
            s3 = np.zeros(n_count, np.uint16)
            total0 = np.zeros(n_count, np.float32)
            total1 = np.zeros(n_count, np.float32)
            total2 = np.zeros(n_count, np.float32)
            total3 = np.zeros(n_count, np.float32)
            mxcsr = round_toward_zero() if rz else np.int32(0)  # (after the allocations, which may fail)
            for k in range(k_count):
                a0, a1, a2, a3 = a[m0, k], a[m0 + 1, k], a[m0 + 2, k], a[m0 + 3, k]
                for n in range(n_count):
                    wv = w[k, n]
                    s0[n] = _step(a0, wv, s0[n], add32, flush, rz, float32_only)
                    s1[n] = _step(a1, wv, s1[n], add32, flush, rz, float32_only)
                    s2[n] = _step(a2, wv, s2[n], add32, flush, rz, float32_only)
                    s3[n] = _step(a3, wv, s3[n], add32, flush, rz, float32_only)
                if chunk and ((k + 1) % chunk == 0 or k == k_count - 1):
                    _fold(total0, s0)
                    _fold(total1, s1)
                    _fold(total2, s2)
                    _fold(total3, s3)
            _store(out, m0, col0, s0, total0, chunk)
            _store(out, m0 + 1, col0, s1, total1, chunk)
            _store(out, m0 + 2, col0, s2, total2, chunk)
            _store(out, m0 + 3, col0, s3, total3, chunk)
        else:
            s = np.zeros(n_count, np.uint16)
            total = np.zeros(n_count, np.float32)
            mxcsr = round_toward_zero() if rz else np.int32(0)
            for m in range(m0, m_count):
                s[:] = 0
                total[:] = 0.0
                for k in range(k_count):
                    av = a[m, k]
                    for n in range(n_count):
                        s[n] = _step(av, w[k, n], s[n], add32, flush, rz, float32_only)
                    if chunk and ((k + 1) % chunk == 0 or k == k_count - 1):
                        _fold(total, s)
                _store(out, m, col0, s, total, chunk)
        if rz:
            restore_mxcsr(mxcsr)


@njit(cache=True, nogil=True)
def _gemm_fma(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, False, False, False, False, chunk)


@njit(cache=True, nogil=True)
def _gemm_add32(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, True, False, False, False, chunk)


@njit(cache=True, nogil=True)
def _gemm_f32(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, False, False, False, True, chunk)


@njit(cache=True, nogil=True)
def _gemm_fma_rz(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, False, False, True, False, 0)


@njit(cache=True, nogil=True)
def _gemm_fma_rz_flush(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, False, True, True, False, 0)


@njit(cache=True, nogil=True)
def _gemm_f32_rz(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, False, False, True, True, 0)


@njit(cache=True, nogil=True)
def _gemm_f32_rz_flush(t0, t1, a, w, out, col0, chunk):
    _gemm(t0, t1, a, w, out, col0, False, True, True, True, 0)


_KERNELS = {(False, False, False, False): _gemm_fma, (True, False, False, False): _gemm_add32,
            (False, False, False, True): _gemm_f32,
            (False, False, True, False): _gemm_fma_rz, (False, True, True, False): _gemm_fma_rz_flush,
            (False, False, True, True): _gemm_f32_rz, (False, True, True, True): _gemm_f32_rz_flush}


def use_fp16_fma(requested: bool | None) -> bool:
    """Whether a kernel runs the fp16 FMA: by default where the CPU has it; requested
    without it, refused (LLVM would widen it to float32 and round twice)."""
    if requested and not available():
        raise ValueError("fp16_fma needs AVX512-FP16, which this CPU lacks")
    return available() if requested is None else requested


def sequential_gemm(a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int, *,
                    add32: bool, flush: bool, toward_zero: bool = False, chunk: int = 0,
                    fp16_fma: bool | None = None) -> None:
    """out[:, col0:col0 + N] = sequential fp16 sums of a (M, K) against w (K, N), in K order;
    with `chunk`, fp16 sums of that many terms folded into an fp32 total (nearest even),
    rounded to fp16 at the end (the chunked model with an fp32 total and fp16 output).

    a, w and out are float16 arrays (a and w C-contiguous); `add32` selects the
    two-rounding float32 addition, `toward_zero` rounds each FMA toward zero (not with
    add32 or chunk), `flush` (with toward_zero only: see `_kernels.native_fp16`) flushes
    subnormal results to signed zero. `fp16_fma`: run the fp16 FMA (default: where the
    CPU has it; addition=fp32 never needs it); without it, float32 arithmetic and F16C's
    conversions (`_step`).
    """
    if toward_zero and (add32 or chunk) or flush and not toward_zero:
        raise ValueError("toward_zero takes the FMA alone (no add32, no chunk); flush needs toward_zero")
    fp16_fma = use_fp16_fma(fp16_fma)
    kernel = _KERNELS[bool(add32), bool(flush), bool(toward_zero), not (fp16_fma or add32)]
    over_tasks(kernel, a.shape[0], a.view(np.uint16), w.view(np.uint16), out.view(np.uint16), col0,
               int(chunk), per_task=_ROWS)


def chunked_gemm_fp32_total(a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int, *, add32: bool,
                            chunk: int, fp16_fma: bool | None = None) -> None:
    """`sequential_gemm` with `chunk`, the fp32 totals stored as they are in a float32 `out`
    (split-K: fp16 partial sums of `chunk` terms combined in fp32); a and w float16."""
    if chunk < 1 or out.dtype != np.float32 or a.dtype != np.float16 or w.dtype != np.float16:
        raise ValueError("chunked_gemm_fp32_total takes chunk >= 1, float16 a and w, and a float32 out")
    kernel = _KERNELS[bool(add32), False, False, not (use_fp16_fma(fp16_fma) or add32)]
    over_tasks(kernel, a.shape[0], a.view(np.uint16), w.view(np.uint16), out, col0,
               int(chunk), per_task=_ROWS)  # (float32 out: its own specialisation)


@njit(cache=True, nogil=True)
def _convert_rows(t0, t1, x, out):
    for i in range(t0, t1):
        for j in range(x.shape[1]):
            out[i, j] = store_f64(out, load_f64(x[i, j]))


def convert(x: np.ndarray, dtype) -> np.ndarray:
    """x (float64, float32 or float16) as a C-contiguous array of `dtype`, fp16 conversions
    by F16C in parallel (NumPy converts to and from float16 in software, about 5 ns an
    element: as long as the kernel itself on a split-K slice), read in place from a 2-D
    view (a composite's slice of its im2col) rather than copied first. x's values must be
    exact in `dtype` where it is float16 (fp16 inputs, fp16 results)."""
    dtype = np.dtype(dtype)
    wide = (np.dtype(np.float64), np.dtype(np.float32))
    narrowing, widening = x.dtype in wide and dtype == np.float16, x.dtype == np.float16 and dtype in wide
    if not ((narrowing or widening) and available(fma=False)):
        return np.ascontiguousarray(x, dtype)
    rows = x if x.ndim == 2 else np.ascontiguousarray(x).reshape(-1, 1)
    out = np.empty(rows.shape, dtype)
    if narrowing:
        over_tasks(_convert_rows, rows.shape[0], rows, out.view(np.uint16))
    else:
        over_tasks(_convert_rows, rows.shape[0], rows.view(np.uint16), out)
    return out.reshape(x.shape)
