"""Which kernel runs a model: the dispatcher over the emulator's compiled kernels.

The kernels live by role: `_kernel_arithmetic` (the one rounding routine and what every
kernel shares, with the format-table layout), `_kernels_reference` (general kernels,
any scalar model), `_kernels_fast` (specialised sequential kernels), `_native_fp16` (the
CPU's own fp16 FMA and F16C conversions), `_native_stochastic` (stochastically rounded fp16
sums in float32 lanes) and `_native_fp32`. Models name the dtype their
kernel reads (`fp16_carriers`, `fp32_carriers`; float64 otherwise). `gemm` picks the
fastest kernel that computes the same bits; `fast=False` forces the general kernel on
float64 arrays. The names callers use (table layout, codes,
`reduce_pairs`, `round_array`) are re-exported here.
"""

from __future__ import annotations

import numpy as np

from convprobe.emulation import _native_fp16, _native_fp32, _native_stochastic
from convprobe.emulation._native_fp16 import convert as _convert
from convprobe.emulation._kernel_arithmetic import *  # noqa: F403 - the table layout and codes, re-exported
from convprobe.emulation._kernel_arithmetic import (ACCUMULATOR, ADDITION, F_EMIN, F_HAS_INF, F_KEEP_SUB, F_MAX, F_PRECISION, IC_KIND, IC_MODE, IC_SAT, NEAREST_EVEN, OUTPUT, PAIRWISE, PRODUCT, SEQUENTIAL, TOTAL,
                                                    CHUNKED, IC_CHUNK, IC_RBITS, STOCHASTIC, TOWARD_ZERO, same_format)
from convprobe.emulation._kernels_fast import (exact_fp16_ok, fast_ok, reduce_gemm_exact_fp16,
                                               reduce_gemm_fast, reduce_gemm_fp16_direct, reduce_gemm_seq_nearest,
                                               reduce_terms_pairwise_nearest)
from convprobe.emulation._kernels_reference import reduce_gemm, reduce_one, reduce_pairs, round_array  # noqa: F401
from convprobe.formats import FP16, FP32


def _nearest_ok(fp, ic) -> bool:
    acc, out = fp[ACCUMULATOR], fp[OUTPUT]
    return (ic[IC_KIND] == SEQUENTIAL and fp[PRODUCT, F_PRECISION] == 0.0 and fp[ADDITION, F_PRECISION] == 0.0 and ic[IC_MODE] == NEAREST_EVEN
            and ic[IC_SAT] == 0 and acc[F_HAS_INF] != 0.0 and acc[F_KEEP_SUB] != 0.0 and acc[F_PRECISION] <= 51
            and acc[F_EMIN] >= -900 and (acc == out).all())


def _as_sequential(ic):
    """ic with the kind set to sequential (to ask the sequential conditions of another kind)."""
    seq = ic.copy()
    seq[IC_KIND] = SEQUENTIAL
    return seq


def _fp16_direct_ok(fp, ic) -> bool:
    acc = fp[ACCUMULATOR]
    add_ok = fp[ADDITION, F_PRECISION] == 0.0 or same_format(fp[ADDITION], FP32)
    return (ic[IC_KIND] == SEQUENTIAL and fp[PRODUCT, F_PRECISION] == 0.0 and add_ok
            and ic[IC_MODE] == NEAREST_EVEN and ic[IC_SAT] == 0
            and same_format(acc, FP16) and (acc == fp[OUTPUT]).all())


def _native_chunked_ok(fp, ic) -> bool:
    """The chunked model `_native_fp16` computes: fp16 chunks as the sequential fp16 model,
    an fp32 total, nearest even, fp16 output with the accumulator's subnormal handling."""
    return ic[IC_KIND] == CHUNKED and _fp16_direct_ok(fp, _as_sequential(ic)) and same_format(fp[TOTAL], FP32)


def _as_nearest(ic):
    """ic with the rounding set to nearest even (to ask the nearest-even conditions)."""
    nearest = ic.copy()
    nearest[IC_MODE] = NEAREST_EVEN
    return nearest


def _native_toward_zero_ok(fp, ic) -> bool:
    """The sequential fp16 model rounded toward zero with exact products and additions,
    overflow to inf: the fp16 FMA, or the float32 FMA and F16C's conversion, under MXCSR's
    toward zero (`_native_fp16`)."""
    return (ic[IC_MODE] == TOWARD_ZERO and fp[ADDITION, F_PRECISION] == 0.0 and _fp16_direct_ok(fp, _as_nearest(ic)))


def _native_stochastic_ok(fp, ic) -> bool:
    """The sequential fp16 model rounded stochastically with exact products and additions,
    subnormals kept, overflow to inf, R = 13 (`_native_stochastic`)."""
    return (ic[IC_MODE] == STOCHASTIC and ic[IC_RBITS] == _native_stochastic.RANDOM_BITS
            and fp[ADDITION, F_PRECISION] == 0.0 and fp[ACCUMULATOR, F_KEEP_SUB] != 0.0
            and _fp16_direct_ok(fp, _as_nearest(ic)))


def float32_sums(fp, ic) -> bool:
    """Whether float32 arithmetic computes this model's sums before its output rounding:
    sequential or pairwise, exact products and additions, nearest even, an fp32
    accumulator keeping subnormals, overflow to inf (each step is then the float32 add, or
    on fp16 products the float32 FMA)."""
    acc = fp[ACCUMULATOR]
    return (ic[IC_KIND] in (SEQUENTIAL, PAIRWISE) and fp[PRODUCT, F_PRECISION] == 0.0
            and fp[ADDITION, F_PRECISION] == 0.0 and ic[IC_MODE] == NEAREST_EVEN and ic[IC_SAT] == 0
            and same_format(acc, FP32) and acc[F_KEEP_SUB] != 0.0)


def native_fp32(fp, ic, inputs_fp16) -> bool:
    """Whether the CPU's float32 FMA computes this model on these inputs: the sequential
    fp32 model (`float32_sums`, output fp32) of fp16 products (see `_native_fp32`)."""
    return (inputs_fp16 and ic[IC_KIND] == SEQUENTIAL and float32_sums(fp, ic)
            and (fp[ACCUMULATOR] == fp[OUTPUT]).all())


def native_fp16(fp, ic, inputs_fp16) -> bool:
    """Whether the CPU's own arithmetic computes this model on these inputs: its fp16 FMA,
    or its float32 arithmetic and F16C's fp16 conversions (see
    `convprobe.emulation._native_fp16`). Flushing
    models only toward zero: rounded to nearest on the subnormal grid, a sum just below
    2**-14 can become 2**-14, where the model rounds with an unbounded exponent first
    and flushes it."""
    flushes = fp[ACCUMULATOR, F_KEEP_SUB] == 0.0
    return (inputs_fp16 and _native_fp16.available(fma=False)  # (F16C; the fp16 FMA is used where present)
            and (_native_toward_zero_ok(fp, ic) or _native_stochastic_ok(fp, ic)
                 or (not flushes and (_fp16_direct_ok(fp, ic) or _native_chunked_ok(fp, ic)))))


def fp16_carriers(fp, ic, inputs_fp16) -> bool:
    """Whether `gemm` takes float16 arrays (a, w and out) for this model and these inputs:
    where the CPU's own fp16 arithmetic computes it (`native_fp16`), and where the CPU
    converts fp16 in hardware (F16C) and `reduce_gemm_fp16_direct` or `reduce_gemm_fast`
    computes it with an fp16 output (their float64 arithmetic on fp16 bit patterns)."""
    return native_fp16(fp, ic, inputs_fp16) or (
        inputs_fp16 and _native_fp16.available(fma=False)
        and (_fp16_direct_ok(fp, ic) or (fast_ok(fp, ic) and same_format(fp[OUTPUT], FP16))))


def _fits_float32(row) -> bool:
    """Whether every value of the format in this table row is a float32 number."""
    return 0 < row[F_PRECISION] <= FP32.precision and row[F_EMIN] >= FP32.emin and row[F_MAX] <= FP32.max


def fp32_carriers(fp, ic, inputs_fp16) -> bool:
    """Whether `gemm` takes float32 arrays (a, w and out): the CPU's float32 FMA
    (`native_fp32`), and the exact model on fp16 inputs with an output that float32 holds
    (`reduce_gemm_exact_fp16`: its products are float32 numbers, exact)."""
    return native_fp32(fp, ic, inputs_fp16) or (exact_fp16_ok(fp, ic, inputs_fp16) and _fits_float32(fp[OUTPUT]))


def gemm(a, w, fp, ic, seed, out, col0, inputs_fp16=False, *, fast=True):
    """out[:, col0:col0 + N] = modelled reductions of a (M, K) against w (K, N).

    `inputs_fp16`: every value of a and w is an fp16 (or fp8) value, which enables
    `reduce_gemm_fp16_direct` and `reduce_gemm_exact_fp16`. float16 arrays (a, w and out,
    where `fp16_carriers` says so) go to the hardware fp16 kernel, the float32-lane
    stochastic kernel (`_native_stochastic`), or the direct or row-tiled kernel on fp16 bit
    patterns; float32 ones (where `fp32_carriers` says so) to
    the float32 FMA kernel or the exact kernel. `fast=False` takes the general kernel,
    whatever the model, on float64 arrays (what the specialised kernels are tested
    against); narrower carriers exist only for specialised kernels."""
    if a.dtype == np.float32:
        if not fp32_carriers(fp, ic, True):
            raise ValueError("float32 arrays are the carrier of the models fp32_carriers names only")
        if native_fp32(fp, ic, True):
            _native_fp32.sequential_gemm(a, np.ascontiguousarray(w), out, col0)
        else:
            reduce_gemm_exact_fp16(a, np.ascontiguousarray(w), fp, ic, np.uint64(seed), out, col0)
    elif a.dtype == np.float16:
        if not fp16_carriers(fp, ic, True):
            raise ValueError("float16 arrays are the carrier of the models fp16_carriers names only")
        chunk = int(ic[IC_CHUNK]) if ic[IC_KIND] == CHUNKED else 0
        add32, flush = fp[ADDITION, F_PRECISION] != 0.0, fp[ACCUMULATOR, F_KEEP_SUB] == 0.0
        if native_fp16(fp, ic, True):
            if _native_stochastic_ok(fp, ic):
                _native_stochastic.stochastic_gemm(a, np.ascontiguousarray(w), out, col0, seed)
            else:
                _native_fp16.sequential_gemm(a, np.ascontiguousarray(w), out, col0, add32=add32, flush=flush,
                                             toward_zero=ic[IC_MODE] == TOWARD_ZERO, chunk=chunk)
        elif _fp16_direct_ok(fp, ic):  # fp16 storage, float64 arithmetic (subnormals flushed)
            reduce_gemm_fp16_direct(a.view(np.uint16), _convert(w, np.float64), not flush, add32, out.view(np.uint16),
                                    col0)
        else:
            reduce_gemm_fast(a.view(np.uint16), _convert(w, np.float64), fp, ic, np.uint64(seed), out.view(np.uint16),
                             col0)
    elif fast and inputs_fp16 and _fp16_direct_ok(fp, ic):
        reduce_gemm_fp16_direct(a, np.ascontiguousarray(w), fp[ACCUMULATOR, F_KEEP_SUB] != 0.0,
                                fp[ADDITION, F_PRECISION] != 0.0, out, col0)
    elif fast and fast_ok(fp, ic) and _nearest_ok(fp, ic):
        acc = fp[ACCUMULATOR]
        reduce_gemm_seq_nearest(a, np.ascontiguousarray(w), int(acc[F_PRECISION]), int(acc[F_EMIN]), acc[F_MAX],
                                out, col0)
    elif fast and fast_ok(fp, ic):
        reduce_gemm_fast(a, np.ascontiguousarray(w), fp, ic, np.uint64(seed), out, col0)
    elif fast and exact_fp16_ok(fp, ic, inputs_fp16):
        reduce_gemm_exact_fp16(a, np.ascontiguousarray(w), fp, ic, np.uint64(seed), out, col0)
    else:
        reduce_gemm(a, np.ascontiguousarray(w.T), fp, ic, np.uint64(seed), out, col0)


def sum_terms(terms, fp, ic, seed, out):
    """out[r] = the modelled sum of terms[0, r], terms[1, r], ... (P, R): the nearest-even
    sequential kernel as the GEMM ones (1, P) x terms, vectorised across r; any other
    model by the general kernel over the rows of terms.T."""
    acc = fp[ACCUMULATOR]
    if fast_ok(fp, ic) and _nearest_ok(fp, ic):
        reduce_gemm_seq_nearest(np.ones((1, terms.shape[0])), terms, int(acc[F_PRECISION]), int(acc[F_EMIN]),
                                acc[F_MAX], out.reshape(1, -1), 0)
    elif ic[IC_KIND] == PAIRWISE and _nearest_ok(fp, _as_sequential(ic)):
        reduce_terms_pairwise_nearest(terms, int(acc[F_PRECISION]), int(acc[F_EMIN]), acc[F_MAX], out)
    else:
        rows = np.ascontiguousarray(terms.T)
        reduce_pairs(rows, np.ones_like(rows), fp, ic, seed, out)
