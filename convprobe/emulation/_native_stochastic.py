"""Sequential fp16 accumulation rounded stochastically, in 16 float32/int32 lanes.

The model: s_{k+1} = SR(s_k + a_k * b_k), the product exact and the sum rounded once to
fp16 stochastically (subnormals kept, overflow to inf), with R = 13 random bits per step
(`convprobe.random_stream`): away from zero iff floor(f * 2**13) + r >= 2**13, f the
discarded fraction of an fp16 ulp. Why float32 arithmetic computes it exactly:

* Under MXCSR's toward zero, the float32 FMA gives y = RZ32(a * b + s), the exact sum
  truncated to float32 (the product of two fp16 values is exact).
* Where |y| >= 2**-14 (fp16's normal range) y has the exact sum's binade, so its
  significand's low 13 bits are floor(f * 2**13), and its higher bits are the sum
  truncated to fp16. Adding r to the bit pattern carries into bit 13 exactly when
  floor(f * 2**13) + r >= 2**13; clearing the low 13 bits then leaves the rounded sum
  (a carry out of the significand moves to the next binade, as the ulp step should).
* Below 2**-14 the fp16 quantum is fixed at 2**-24. Adding 2**-14 to |y| (truncating)
  gives 2**-14 + floor(|y| * 2**37) * 2**-37, whose low 13 bits are floor(f * 2**13) and
  whose next 10 the subnormal fp16 significand: the same carry, then subtracting 2**-14
  back (exact).
* A rounded magnitude above 65504 is inf; inf and NaN pass through (their low 13 bits
  are zero, so no carry), and the sign is put back last, so a zero sum keeps its sign.

Each task runs four rows (independent chains) with the loop over output channels in
vector lanes; the random integers come from the stream's 32-bit hash in the same lanes.
Tested bit for bit against the float64 kernels and the oracle
(tests/emulation/test_native_stochastic.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import (f2i32, fma_fp32, i2f32, narrow, stream_key, stream_word, weyl,
                                                    widen)
from convprobe.emulation._native_fp16 import restore_mxcsr, round_toward_zero
from convprobe.emulation._threads import over_tasks
from convprobe.formats import FP16
from convprobe.random_stream import default_bits

__all__ = ["RANDOM_BITS", "stochastic_gemm"]

_ROWS = 4  # rows per task: independent accumulation chains
RANDOM_BITS = default_bits(FP16.precision)  # R = 13: float32's significand bits below fp16's
_LOW = np.int32((1 << RANDOM_BITS) - 1)
_SHIFT = np.uint32(32 - RANDOM_BITS)
_NORMAL = np.float32(2.0**FP16.emin)  # 2**-14
_MAX = np.float32(FP16.max)
_SIGN = np.int32(-(1 << 31))
_INF_BITS = np.int32(0x7F800000)


@njit(cache=True, inline="always")
def _round(y, r):
    """y = RZ32(exact sum) rounded stochastically to fp16 with the 13-bit integer r (see the
    module's text); returns a float32 holding an fp16 value, inf or NaN."""
    sign = f2i32(y) & _SIGN
    magnitude = abs(y)
    lift = _NORMAL if magnitude < _NORMAL else np.float32(0.0)
    z = magnitude + lift  # truncating: aligns a subnormal sum's bits as a normal one's
    rounded = i2f32(np.int32(np.int32(f2i32(z) + r) & ~_LOW)) - lift
    bits = _INF_BITS if rounded > _MAX else f2i32(rounded)
    return i2f32(np.int32(bits | sign))


@njit(cache=True, nogil=True)
def _gemm(t0, t1, a, w, out, col0, seed):
    """Tasks t0 .. t1 - 1 (four rows each; the last task's missing rows repeat its last row
    and are not stored) of `stochastic_gemm`, each under MXCSR's toward zero from its first
    term to its last store, the thread's mode put back after."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    width = out.shape[1]
    s0, s1 = np.empty(n_count, np.float32), np.empty(n_count, np.float32)
    s2, s3 = np.empty(n_count, np.float32), np.empty(n_count, np.float32)
    k0, k1 = np.empty(n_count, np.uint32), np.empty(n_count, np.uint32)
    k2, k3 = np.empty(n_count, np.uint32), np.empty(n_count, np.uint32)
    for t in range(t0, t1):
        m0 = t * _ROWS
        rows = min(_ROWS, m_count - m0)
        m1, m2, m3 = min(m0 + 1, m_count - 1), min(m0 + 2, m_count - 1), min(m0 + 3, m_count - 1)
        s0[:], s1[:], s2[:], s3[:] = 0.0, 0.0, 0.0, 0.0
        for n in range(n_count):
            k0[n] = stream_key(seed, m0 * width + col0 + n)
            k1[n] = stream_key(seed, m1 * width + col0 + n)
            k2[n] = stream_key(seed, m2 * width + col0 + n)
            k3[n] = stream_key(seed, m3 * width + col0 + n)
        mxcsr = round_toward_zero()  # (after every allocation: nothing below can fail)
        for k in range(k_count):
            a0, a1, a2, a3 = widen(a[m0, k]), widen(a[m1, k]), widen(a[m2, k]), widen(a[m3, k])
            step = weyl(k)  # term k is event k
            for n in range(n_count):
                wv = widen(w[k, n])
                s0[n] = _round(fma_fp32(a0, wv, s0[n]), np.int32(stream_word(k0[n], step) >> _SHIFT))
                s1[n] = _round(fma_fp32(a1, wv, s1[n]), np.int32(stream_word(k1[n], step) >> _SHIFT))
                s2[n] = _round(fma_fp32(a2, wv, s2[n]), np.int32(stream_word(k2[n], step) >> _SHIFT))
                s3[n] = _round(fma_fp32(a3, wv, s3[n]), np.int32(stream_word(k3[n], step) >> _SHIFT))
        for n in range(n_count):
            out[m0, col0 + n] = narrow(s0[n])  # fp16 values: exact in any rounding mode
            if rows > 1:
                out[m1, col0 + n] = narrow(s1[n])
            if rows > 2:
                out[m2, col0 + n] = narrow(s2[n])
            if rows > 3:
                out[m3, col0 + n] = narrow(s3[n])
        restore_mxcsr(mxcsr)


def stochastic_gemm(a: np.ndarray, w: np.ndarray, out: np.ndarray, col0: int, seed: int) -> None:
    """out[:, col0:col0 + N] = the sequential fp16 model rounded stochastically (R = 13) of
    a (M, K) against w (K, N), in K order; float16 arrays, a and w C-contiguous. Output
    (m, col0 + n) draws from the stream of its flat index m * out.shape[1] + col0 + n,
    event k for term k, as every kernel does. Needs F16C (`_native_fp16.available(fma=False)`)."""
    over_tasks(_gemm, a.shape[0], a.view(np.uint16), w.view(np.uint16), out.view(np.uint16), col0,
               np.uint64(seed), per_task=_ROWS)
