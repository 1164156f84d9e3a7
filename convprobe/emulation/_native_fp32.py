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

`lanes_gemm` is the same step with the terms dealt to interleaved accumulators (term k to
lane k mod W), whose sums are then added in float32, in order or as a pairwise tree: the
`Lanes` composite of that model with a float32 combine (each float32 addition of two
float32 numbers is the exact sum rounded once, nearest even, as the model's).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import fma_fp32, load_tile, prefer_512_bit_vectors
from convprobe.emulation._threads import over_tasks

__all__ = ["lanes_gemm", "sequential_gemm"]

_ROWS = 4  # rows per task: independent accumulation chains
_TILE = 64  # rows per task of the lanes kernel, its inner loop: four 16-lane vectors


@njit(cache=True, nogil=True)
def _gemm(t0, t1, a, w, out, col0):
    """Tasks t0 .. t1 - 1 (four rows each) of `sequential_gemm`."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    for t in range(t0, t1):
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
    over_tasks(_gemm, a.shape[0], a, w, out, col0, per_task=_ROWS)


@njit(cache=True, nogil=True)
def _lanes_gemm(t0, t1, a, w, width, pairwise, out, col0):
    """Row tiles t0 .. t1 - 1 of `lanes_gemm`."""
    prefer_512_bit_vectors()
    m_count, k_count = a.shape
    n_count = w.shape[1]
    at = np.zeros((k_count, _TILE), np.float32)  # the tile's rows, transposed
    s = np.empty((width, _TILE), np.float32)
    for t in range(t0, t1):
        m0 = t * _TILE
        rows = min(_TILE, m_count - m0)
        load_tile(a, m0, rows, at)
        for n in range(n_count):
            s[:] = 0.0
            for k in range(k_count):
                wv, lane = w[k, n], k % width
                for i in range(_TILE):
                    s[lane, i] = fma_fp32(at[k, i], wv, s[lane, i])
            if pairwise:  # adjacent pairs, level by level, an odd last sum carried up
                count = width
                while count > 1:
                    half = count // 2
                    for j in range(half):
                        for i in range(_TILE):
                            s[j, i] = s[2 * j, i] + s[2 * j + 1, i]
                    if count & 1:
                        s[half] = s[count - 1]
                    count = half + (count & 1)
                for i in range(rows):
                    out[m0 + i, col0 + n] = s[0, i]
            else:  # in lane order, from +0
                for i in range(rows):
                    total = np.float32(0.0)
                    for lane in range(width):
                        total += s[lane, i]
                    out[m0 + i, col0 + n] = total


def lanes_gemm(a: np.ndarray, w: np.ndarray, width: int, pairwise: bool, out: np.ndarray, col0: int) -> None:
    """out[:, col0:col0 + N] = float32 sums of a (M, K) against w (K, N) in `width`
    interleaved sequential accumulators (term k to lane k mod width, each from +0), the lane
    sums then added in float32 in lane order from +0, or pairwise (`pairwise`); a and w
    (holding fp16 or narrower values) and out float32, w C-contiguous."""
    over_tasks(_lanes_gemm, a.shape[0], a, w, width, pairwise, out, col0, per_task=_TILE)
