"""The telemetry tables of `telemetry.batched_stats`, counted by a compiled loop on the host.

XLA's CPU backend runs the scatter-adds that fill the tables as serial loops of a few
nanoseconds an element, and its reductions (the extremes) hardly faster: on a CPU they
were most of a measured step's cost beyond the fp32 shadow's own pass. Here numba reads
each element once, by blocks: a loop over the low-precision values that computes their
share of each element's table code and the running extremes on their own bit patterns
(an fp16 value is never widened), a loop over the shadow values that completes the codes,
both with no branch on the data (they vectorise), then a loop of increments. It
reads bit patterns alone (no float compare, so no denormals-are-zero: an fp32
subnormal counts as the nonzero it is, as in `telemetry.numpy_tensor_stats`). `telemetry.batched_stats` calls it through
`tf.numpy_function` when the step is not compiled by XLA and no GPU holds the tensors,
for fp16, bf16 and fp32 tensors and thresholds (`telemetry._host_reads`); its statistics
are the XLA path's (tested on every fp16 code point and for each format).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numba import njit

from convprobe.emulation._kernel_arithmetic import bitlen32, prefer_512_bit_vectors

__all__ = ["DTYPES", "LowBits", "fill_tables", "fp16_at_or_above", "low_bits"]

#: The tensor dtypes `fill_tables` reads exactly on their bit patterns.
DTYPES = ("float16", "bfloat16", "float32")


class LowBits(IntEnum):
    """How `fill_tables` reads the low tensor's patterns: fp32's and fp16's as they are, bf16's
    widened to fp32's (the top half of them)."""

    FP32 = 0
    BF16 = 1
    FP16 = 2

#: Interleaved copies of each table: consecutive elements in one bin would otherwise wait on
#: each other's increments (a store-to-load chain).
_COPIES = 4


def low_bits(x: np.ndarray) -> tuple[np.ndarray, LowBits]:
    """(`x`'s bit patterns, flattened, how `fill_tables` reads them): fp16 and bf16 are read
    as their 16-bit patterns, fp32 as its own (`DTYPES`: `telemetry._host_reads` admits no other)."""
    x = np.ascontiguousarray(x).reshape(-1)
    if x.dtype == np.float16:
        return x.view(np.uint16), LowBits.FP16
    if x.dtype.name == "bfloat16":  # (ml_dtypes' type, not imported: it costs half a second)
        return x.view(np.uint16), LowBits.BF16
    return x.astype(np.float32, copy=False).view(np.uint32), LowBits.FP32


@njit(cache=True, nogil=True, inline="always")
def _fp16_magnitude(bits):
    """The fp32 pattern of |x| (an int32) for the fp16 pattern `bits` (exact: fp16 values are
    fp32 values); a subnormal m * 2^-24 normalised by its leading bit."""
    h = np.int32(bits & np.uint16(0x7FFF))
    field = h >> np.int32(10)
    mantissa = h & np.int32(0x3FF)
    top = max(bitlen32(mantissa) - np.int32(1), np.int32(0))  # a subnormal's leading bit: exponent top - 24
    subnormal = ((top + np.int32(103)) << np.int32(23)) | ((mantissa << (np.int32(23) - top)) & np.int32(0x7FFFFF))
    normal = ((field + np.int32(112)) << np.int32(23)) | (mantissa << np.int32(13))
    special = np.int32(0x7F800000) | (mantissa << np.int32(13))
    return np.int32(special if field == np.int32(0x1F) else
                    ((subnormal if mantissa != np.int32(0) else np.int32(0)) if field == np.int32(0) else normal))


@njit(cache=True, nogil=True, inline="always")
def _wide_magnitude(bits, shift):
    """The fp32 pattern of |x| (an int32) for an fp32 pattern (`shift` 0) or a bf16 pattern
    (`shift` 16: a bf16 pattern is the top half of its fp32 pattern)."""
    return np.int32((np.uint32(bits) << shift) & np.uint32(0x7FFFFFFF))


@njit(cache=True, nogil=True, inline="always")
def _exponent_bin(magnitude, min_exponent, max_exponent):
    """Bin of floor(log2 x) for the fp32 pattern `magnitude`, as `telemetry._exponent_bins`."""
    return _bin((magnitude >> np.int32(23)) - np.int32(127), min_exponent, max_exponent)


@njit(cache=True, nogil=True, inline="always")
def _bin(exponent, min_exponent, max_exponent):
    """The histogram bin of floor(log2 x) = `exponent`, clipped to the first and last bins."""
    return np.int32(min(max(exponent, min_exponent - np.int32(1)), max_exponent) - (min_exponent - np.int32(1)))


@njit(cache=True, nogil=True, inline="always")
def _count(condition):
    return np.int32(1) if condition else np.int32(0)


@njit(cache=True, nogil=True)
def fp16_at_or_above(threshold):
    """The smallest fp16 magnitude pattern whose value is at or above the fp32 pattern
    `threshold` (0x7C00, inf's, for one above fp16's largest): the same class boundary read
    on fp16's own patterns, whose order is their values'. A binary search."""
    below, above = np.int32(0), np.int32(0x7C00)
    while below < above:
        middle = (below + above) // np.int32(2)
        if _fp16_magnitude(np.uint16(middle)) < threshold:
            below = middle + np.int32(1)
        else:
            above = middle
    return below


@njit(cache=True, nogil=True)
def _fp16_low_codes(low, normal, min_exponent, max_exponent, n_shadow_classes, joint_codes, extremes):
    """Each element's joint code less its shadow class's share, read on the fp16 pattern itself
    (no widening: with the sign cleared, its order is the magnitudes'), and the running extremes
    as fp16 patterns (int32 [2]: the smallest nonzero less one, the largest finite). `normal`:
    the smallest pattern at or above the format's smallest normal. floor(log2|x|) is the exponent
    field less 15, or for a subnormal m * 2^-24 the bit length of m less 25; a zero's bin is 0's,
    a non-finite one's 1.0's, as `_fp32_low_codes` gives them."""
    prefer_512_bit_vectors()
    n_bins = max_exponent - min_exponent + np.int32(2)
    stride = n_shadow_classes * n_bins
    inf = np.int32(0x7C00)
    smallest, biggest = extremes[0], extremes[1]
    for j in range(low.size):
        h = np.int32(low[j]) & np.int32(0x7FFF)
        # 0 zero, 1 subnormal, 2 normal, 3 inf, 4 nan
        low_class = _count(h > np.int32(0)) + _count(h >= normal) + _count(h >= inf) + _count(h > inf)
        exponent = (np.int32(0) if h >= inf else (h >> np.int32(10)) - np.int32(15) if h >= np.int32(0x400) else
                    bitlen32(h) - np.int32(25) if h > np.int32(0) else np.int32(-127))
        joint_codes[j] = low_class * stride + _bin(exponent, min_exponent, max_exponent)
        biggest = max(biggest, h if h < inf else np.int32(0))
        smallest = min(smallest, h - np.int32(1) if h > np.int32(0) else inf)
    extremes[0] = smallest
    extremes[1] = biggest


@njit(cache=True, nogil=True)
def _fp32_low_codes(low, shift, normal, min_exponent, max_exponent, n_shadow_classes, joint_codes, extremes):
    """`_fp16_low_codes` for fp32 or bf16 patterns (`_wide_magnitude`); the extremes as fp32
    patterns."""
    prefer_512_bit_vectors()
    n_bins = max_exponent - min_exponent + np.int32(2)
    stride = n_shadow_classes * n_bins
    inf = np.int32(0x7F800000)
    one_bin = _exponent_bin(np.int32(0x3F800000), min_exponent, max_exponent)  # a non-finite low: 1.0's
    smallest, biggest = extremes[0], extremes[1]
    for j in range(low.size):
        a = _wide_magnitude(low[j], shift)
        low_class = _count(a > np.int32(0)) + _count(a >= normal) + _count(a >= inf) + _count(a > inf)
        low_bin = _exponent_bin(a, min_exponent, max_exponent) if a < inf else one_bin
        joint_codes[j] = low_class * stride + low_bin
        biggest = max(biggest, a if a < inf else np.int32(0))
        smallest = min(smallest, a - np.int32(1) if a > np.int32(0) else inf)
    extremes[0] = smallest
    extremes[1] = biggest


@njit(cache=True, nogil=True)
def _shadow_codes(shadow, thresholds, bounds, min_exponent, max_exponent, joint_codes, shadow_codes):
    """Add each element's shadow class's share to its joint code; write its shadow code."""
    prefer_512_bit_vectors()
    flush, normal, largest = thresholds
    inf = np.int32(0x7F800000)
    n_bins = max_exponent - min_exponent + np.int32(2)
    n_buckets = np.int32(len(bounds) + 1)
    for j in range(shadow.size):
        s = np.int32(shadow[j] & np.uint32(0x7FFFFFFF))
        # 0 zero, 1 rounds to zero, 2 subnormal, 3 normal, 4 finite beyond the range, 5 non-finite
        shadow_class = (_count(s > np.int32(0)) + _count(s > flush) + _count(s >= normal) + _count(s > largest)
                        + _count(s >= inf))
        shadow_bin = _exponent_bin(s, min_exponent, max_exponent) if np.int32(0) < s < inf else n_bins
        bucket = np.int32(0)
        for bound in bounds:
            bucket += _count(s > bound)
        joint_codes[j] += shadow_class * n_bins
        shadow_codes[j] = shadow_bin * n_buckets + bucket


#: Elements classified per block before they are counted: the codes stay in the L1 cache.
_BLOCK = 2048


@njit(cache=True, nogil=True)
def fill_tables(low, kind, shadow, thresholds, bounds, min_exponent, max_exponent, n_shadow_classes, joint,
                shadow_table, extremes):
    """Count one tensor into `joint` [low class, shadow class, low bin] and `shadow_table`
    [shadow bin, bucket] (flattened, int32, added to), and write into `extremes` (uint32 [2])
    the fp32 patterns of the smallest nonzero and the largest finite |low|.

    `low`, `kind`: `low_bits`; `shadow`: uint32 fp32 patterns; `thresholds`: int32 fp32
    patterns of the format's flush bound, smallest normal (both sides' subnormal bound) and
    largest value (flush <= normal <= largest < inf); `bounds`: the
    counterfactual bucket bounds (`telemetry._counterfactual_buckets`), a tuple of int32.
    The classes and bins are `telemetry._tensor_tables'`, as sums of comparisons, by
    blocks: the low side's codes (read in the low's own patterns), the shadow side's, then a
    loop of increments into interleaved copies of the tables."""
    joint_copies = np.zeros((_COPIES, joint.size), np.int32)
    shadow_copies = np.zeros((_COPIES, shadow_table.size), np.int32)
    joint_codes = np.empty(_BLOCK, np.int32)
    shadow_codes = np.empty(_BLOCK, np.int32)
    fp16 = kind == LowBits.FP16
    normal = fp16_at_or_above(thresholds[1]) if fp16 else thresholds[1]
    running = np.array([(0x7C00 if fp16 else 0x7F800000) - 1, 0], np.int32)  # the smallest less one, the largest
    shift = np.int32(16 if kind == LowBits.BF16 else 0)
    for start in range(0, low.size, _BLOCK):
        stop = min(start + _BLOCK, low.size)
        if fp16:
            _fp16_low_codes(low[start:stop], normal, min_exponent, max_exponent, n_shadow_classes, joint_codes,
                            running)
        else:
            _fp32_low_codes(low[start:stop], shift, normal, min_exponent, max_exponent, n_shadow_classes,
                            joint_codes, running)
        _shadow_codes(shadow[start:stop], thresholds, bounds, min_exponent, max_exponent, joint_codes, shadow_codes)
        size = stop - start
        j = 0
        while j + _COPIES <= size:  # each copy its own increments: no increment waits on the one before
            for copy in range(_COPIES):
                joint_copies[copy, joint_codes[j + copy]] += 1
                shadow_copies[copy, shadow_codes[j + copy]] += 1
            j += _COPIES
        for k in range(j, size):
            joint_copies[0, joint_codes[k]] += 1
            shadow_copies[0, shadow_codes[k]] += 1
    for copy in range(_COPIES):
        joint += joint_copies[copy]
        shadow_table += shadow_copies[copy]
    smallest, biggest = running[0] + 1, running[1]  # inf where none is nonzero and finite
    if fp16:
        smallest = _fp16_magnitude(np.uint16(smallest))
        biggest = _fp16_magnitude(np.uint16(biggest))
    extremes[0] = smallest
    extremes[1] = biggest
