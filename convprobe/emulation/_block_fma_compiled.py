"""The block-FMA adder compiled (numba) for GEMMs: the hot path of convolutions under
tensor-core models.

Same definition as `_block_fma` (NumPy, any parameters) and the oracle; this kernel
covers the common case - exact products, alignment to e_a + e_b, truncation,
contiguous K, c fused, no accumulator input (convolutions start from +0) - and loops
per row of the output with the N channels updated together, so it needs no (M, N, b)
temporaries. Why float64 is exact here is `_block_fma`'s argument; the scaling by
2**-q is a multiplication by a power of two built from its bits, exact while 2**-q and
the scaled terms stay normal, which `applies` checks from the formats' ranges.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from convprobe.emulation._kernel_arithmetic import f2i, i2f, round_f64
from convprobe.options import Alignment, CAddition, KLayout

__all__ = ["applies", "gemm"]

_NONE = np.iinfo(np.int64).min // 4  # as `_block_fma`: the exponent of a zero


def applies(model) -> bool:
    """Whether `gemm` computes `model` (otherwise `_block_fma.gemm` does)."""
    adder_p = model.adder.precision + model.extra_bits
    # quanta 2**q with q = E - adder_p + 1: E >= 2 * input emin - 2 (subnormal inputs clamp at
    # emin; the product's own bits reach 2 * (emin - p_in + 1)), so 2**-q and term * 2**-q
    # stay far inside float64's normal range for every registered input format
    return (model.product == "exact" and model.alignment == Alignment.INPUT_EXPONENTS
            and model.truncate and model.layout == KLayout.CONTIGUOUS
            and model.c_addition == CAddition.FUSED and model.step == model.b
            and 2 * model.input.emin - 2 - adder_p > -1000 and model.input.emax * 2 + 4 < 1000
            and model.accumulator.emin - adder_p > -1000 and model.accumulator.emax < 1000)


@njit(cache=True, inline="always")
def _exponent(x, emin):
    """floor(log2|x|) clamped at emin; _NONE for 0 (x finite)."""
    if x == 0.0:
        return _NONE
    e = ((f2i(x) >> 52) & 0x7FF) - 1023
    if e == -1023:  # a float64 subnormal: far below every format's emin
        return emin
    return e if e > emin else emin


@njit(cache=True, inline="always")
def _pow2(e):
    """2**e for -1022 <= e <= 1023, from its bits."""
    return i2f(np.int64(e + 1023) << 52)


@njit(cache=True, parallel=True)
def _gemm(a, w, ea, ew, b, adder_p, acc_emin, acc_keep, bp, bemin, bmax, binf, bkeep, mode, sat,
          out):
    """Branch-free inner loops: a zero input has exponent _NONE (so it never sets the block's
    E) and a zero product adds 0; an inf or NaN makes the row's scaled sum non-finite, and
    such a row takes the IEEE sum instead."""
    m_count, k_count = a.shape
    n_count = w.shape[1]
    for m in prange(m_count):
        s = np.zeros(n_count)
        top = np.empty(n_count, dtype=np.int64)
        scale = np.empty(n_count)
        total = np.empty(n_count)
        for j0 in range(0, k_count, b):
            j1 = min(j0 + b, k_count)
            for n in range(n_count):
                sv = s[n]
                top[n] = _NONE if (sv == 0.0 or not math.isfinite(sv)) else (
                    _exponent(sv, acc_emin) if acc_keep else _exponent(sv, -1022))
            for j in range(j0, j1):
                e_a = ea[m, j]
                for n in range(n_count):
                    top[n] = max(top[n], e_a + ew[j, n])
            for n in range(n_count):
                live = top[n] > _NONE // 2
                scale[n] = _pow2(adder_p - 1 - top[n]) if live else 0.0
                total[n] = np.trunc(s[n] * scale[n]) if live else 0.0
            for j in range(j0, j1):
                av = a[m, j]
                for n in range(n_count):
                    total[n] += np.trunc(av * w[j, n] * scale[n])  # a float trunc: NaN stays NaN
            for n in range(n_count):
                if not (math.isfinite(total[n]) and math.isfinite(s[n])):
                    t = s[n]  # an inf or NaN in the block: the IEEE sum of s and the products
                    for j in range(j0, j1):
                        t += a[m, j] * w[j, n]
                    s[n] = t
                elif top[n] > _NONE // 2:  # an exact zero sum is +0, as in IEEE addition
                    value = total[n] * _pow2(top[n] - adder_p + 1) if total[n] != 0.0 else 0.0
                    s[n] = round_f64(value, bp, bemin, bmax, binf, bkeep, mode, sat, 0, 1)
        for n in range(n_count):
            out[m, n] = s[n]


def gemm(a: np.ndarray, w: np.ndarray, ea: np.ndarray, ew: np.ndarray, model) -> np.ndarray:
    """out[m, n] = the block-FMA reduction of a[m, :] against w[:, n] (float64, +0 start),
    rounded to the accumulator; `ea`, `ew` the inputs' clamped exponents."""
    from convprobe.emulation.rounding import MODE_CODES

    fmt, acc = model.block_format, model.accumulator
    keep = fmt.subnormals and model.subnormals == "keep"
    out = np.empty((a.shape[0], w.shape[1]))
    _gemm(a, w, ea, ew, model.b, model.adder.precision + model.extra_bits, acc.emin,
          acc.subnormals, fmt.precision, fmt.emin, fmt.max, fmt.has_inf, keep,
          MODE_CODES[model.rounding], model.overflow == "saturate", out)
    return out
