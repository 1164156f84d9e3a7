"""The general (reference) kernels: every scalar model (sequential, pairwise, chunked, exact),
one output at a time, through the shared rounding routine. The fast kernels
(`_kernels_fast`) are tested bit for bit against these, and these against the Fraction
oracle."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import (ACCUMULATOR, CHUNKED, IC_CHUNK, IC_KIND, IC_MODE,
                                                    IC_RBITS, IC_SAT, OUTPUT, PAIRWISE, SEQUENTIAL,
                                                    STOCHASTIC, TOTAL, _NLIMBS, accumulate, add_slot,
                                                    product, random_bits, round_f64, round_slot, special_sum,
                                                    superacc_add, superacc_round)
from convprobe.emulation._threads import over_tasks


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
        if nan or pinf or ninf:
            s = special_sum(nan, pinf, ninf)
        else:
            r = random_bits(seed, index, ev, rbits) if mode == STOCHASTIC else 0
            ev += 1
            s = superacc_round(limbs, fp, ACCUMULATOR, mode, sat, r, rbits)
    r = random_bits(seed, index, ev, rbits) if mode == STOCHASTIC else 0
    return round_slot(s, fp, OUTPUT, mode, sat, r, rbits)


def reduce_pairs(a, b, fp, ic, seed, out):
    """out[m] = reduction of a[m, :] * b[m, :] (a, b C-contiguous (M, K))."""
    over_tasks(_pairs_rows, a.shape[0], a, b, fp, ic, seed, out)


@njit(cache=True, nogil=True)
def _pairs_rows(t0, t1, a, b, fp, ic, seed, out):
    """Rows t0 .. t1 - 1 of `reduce_pairs`."""
    m_count, k = a.shape
    af = a.ravel()
    bf = b.ravel()
    for m in range(t0, t1):
        scratch = np.empty(max(k, 1))
        limbs = np.zeros(_NLIMBS, dtype=np.int64)
        out[m] = reduce_one(af, m * k, bf, m * k, k, fp, ic, seed, m, scratch, limbs)


def reduce_gemm(a, bt, fp, ic, seed, out, col0):
    """out[m, col0 + n] = reduction of a[m, :] * bt[n, :] (a (M, K), bt (N, K), C-contiguous).

    The stochastic-rounding stream of output (m, col) is keyed by its flat index
    m * out.shape[1] + col, so grouped layers draw the same bits as one call.
    """
    over_tasks(_gemm_rows, a.shape[0], a, bt, fp, ic, seed, out, col0)


@njit(cache=True, nogil=True)
def _gemm_rows(t0, t1, a, bt, fp, ic, seed, out, col0):
    """Rows t0 .. t1 - 1 of `reduce_gemm`."""
    m_count, k = a.shape
    n_count = bt.shape[0]
    width = out.shape[1]
    af = a.ravel()
    bf = bt.ravel()
    for m in range(t0, t1):
        scratch = np.empty(max(k, 1))
        limbs = np.zeros(_NLIMBS, dtype=np.int64)
        for n in range(n_count):
            out[m, col0 + n] = reduce_one(af, m * k, bf, n * k, k, fp, ic, seed,
                                          m * width + col0 + n, scratch, limbs)


def round_array(x, out, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits):
    """Vectorised `round_f64` over flat arrays (r: one random integer per element)."""
    over_tasks(_round_elements, x.shape[0], x, out, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits)


@njit(cache=True, nogil=True)
def _round_elements(t0, t1, x, out, p, emin, maxv, has_inf, keep_sub, mode, sat, r, rbits):
    """Elements t0 .. t1 - 1 of `round_array`."""
    for i in range(t0, t1):
        out[i] = round_f64(x[i], p, emin, maxv, has_inf, keep_sub, mode, sat, r[i], rbits)
