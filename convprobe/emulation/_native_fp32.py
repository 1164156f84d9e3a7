"""Sequential fp32 accumulation of fp16 products on the CPU's own float32 fused multiply-add.

Why this is exact: the sequential fp32 model computes s_{k+1} = fp32(s_k + a_k * b_k) with
the product exact, one nearest-even rounding per step, subnormals kept and overflow to
inf. For fp16 (or fp8) inputs the product has at most 22 significand bits and lies in
float32's normal range, so that step is, operation for operation, the IEEE 754
fusedMultiplyAdd in binary32 on the inputs widened to float32 (exactly). `llvm.fma.f32`
is that operation on every CPU (a single instruction where the CPU has FMA, the C
library's `fmaf` elsewhere, never a multiply and an add). The tests compare it with the
float64 kernels bit for bit.

Each parallel task runs four rows together so that four independent FMA chains hide the
instruction's latency; LLVM vectorises the loop over output channels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["fma_fp32", "sequential_gemm"]

_ROWS = 4  # rows per task: independent accumulation chains


@intrinsic
def fma_fp32(typingctx, a, b, c):
    """a * b + c in float32, one rounding (in the rounding mode MXCSR sets)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fma, args)

    return sig, codegen


@intrinsic
def fma_fp64(typingctx, a, b, c):
    """a * b + c in float64, one rounding (`llvm.fma.f64`, as `fma_fp32`)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f64, [f64, f64, f64]), "llvm.fma.f64")
        return builder.call(fma, args)

    return sig, codegen


@njit(cache=True, parallel=True)
def _gemm(a, w, out, col0):
    m_count, k_count = a.shape
    n_count = w.shape[1]
    for t in prange((m_count + _ROWS - 1) // _ROWS):
        m0 = t * _ROWS
        if m0 + _ROWS <= m_count:
            s0 = np.zeros(n_count, np.float32)
            s1 = np.zeros(n_count, np.float32)
            s2 = np.zeros(n_count, np.float32)
            s3 = np.zeros(n_count, np.float32)
            for k in range(k_count):
                a0, a1, a2, a3 = a[m0, k], a[m0 + 1, k], a[m0 + 2, k], a[m0 + 3, k]
                for n in range(n_count):
                    wv = w[k, n]
                    s0[n] = fma_fp32(a0, wv, s0[n])
                    s1[n] = fma_fp32(a1, wv, s1[n])
                    s2[n] = fma_fp32(a2, wv, s2[n])
                    s3[n] = fma_fp32(a3, wv, s3[n])
            for n in range(n_count):
                out[m0, col0 + n] = s0[n]
                out[m0 + 1, col0 + n] = s1[n]
                out[m0 + 2, col0 + n] = s2[n]
                out[m0 + 3, col0 + n] = s3[n]
        else:
            for m in range(m0, m_count):
                s = np.zeros(n_count, np.float32)
                for k in range(k_count):
                    av = a[m, k]
                    for n in range(n_count):
                        s[n] = fma_fp32(av, w[k, n], s[n])
                for n in range(n_count):
                    out[m, col0 + n] = s[n]


def sequential_gemm(a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int) -> None:
    """out[:, col0:col0 + N] = sequential fp32 sums of a (M, K) against w (K, N), in K order;
    a, w (holding fp16 or narrower values) and out are float32 arrays, a and w C-contiguous."""
    _gemm(a, w, out, col0)
