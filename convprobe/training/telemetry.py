"""Gradient-underflow telemetry: a low-precision gradient against its fp32 shadow.

For every tensor (a weight gradient or an activation gradient, both taken on
the *scaled* loss before unscaling, as the low-precision backward pass holds
them) and its fp32 shadow (the same layer, same weights, same batch, computed
in fp32 on the same scaled loss), the elements are sorted into:

- routing zeros: exactly zero in both (ReLU, pooling routing): not underflow,
  they appear at every loss scale;
- flushed: zero in the low-precision run while the fp32 shadow |S·g| is
  nonzero and at most half the format's smallest subnormal (2^-25 for fp16):
  below it everything rounds to zero, and the tie at 2^-25 rounds to even, zero;
- lost: zero in the low-precision run although the shadow value is
  representable (an upstream flush or cancellation made it zero);
- subnormal: the low-precision value lies in [smallest subnormal, smallest
  normal) (2^-24 .. 2^-14 for fp16) and carries fewer significant bits;
- class mismatch: the element's range class (zero, subnormal, normal,
  non-finite) in the low-precision run differs from the class its fp32 shadow
  value falls in. Two low-precision runs (say with and without XLA) can put an
  element in different classes only if one of them mismatches the shadow, so
  the sum of their mismatch counts bounds how far their other counts can differ;
- inf / nan counts, min nonzero and max finite |g| (in scaled units), and a
  log2-magnitude histogram of both the low-precision values and the shadow.

The thresholds come from `convprobe.formats`, so bf16 and fp32 runs report in
the same terms (nothing flushes in fp32 by construction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from convprobe.formats import Format

__all__ = [
    "COUNT_FIELDS",
    "HIST_MIN_EXPONENT",
    "HIST_MAX_EXPONENT",
    "Thresholds",
    "histogram_edges",
    "batched_stats",
    "numpy_tensor_stats",
    "encode_histogram",
    "decode_histogram",
]

#: Integer counts per tensor, in this order.
COUNT_FIELDS = (
    "n", "routing_zero", "flushed", "lost", "subnormal", "inf", "nan",
    "shadow_underflow", "shadow_subnormal", "class_mismatch",
)
#: Histogram bins: bin k counts nonzero finite |x| with floor(log2|x|) = HIST_MIN_EXPONENT + k - 1;
#: the first bin collects everything below 2^HIST_MIN_EXPONENT, the last everything >= 2^HIST_MAX_EXPONENT.
HIST_MIN_EXPONENT = -40
HIST_MAX_EXPONENT = 16
N_BINS = HIST_MAX_EXPONENT - HIST_MIN_EXPONENT + 2


def histogram_edges() -> list[int]:
    """Exponent label of each bin (first = 'below', last = 'at or above')."""
    return list(range(HIST_MIN_EXPONENT - 1, HIST_MAX_EXPONENT + 1))


@dataclass(frozen=True)
class Thresholds:
    """Magnitudes that separate flushed / subnormal / normal for one format."""

    flush_below: float  # half the smallest subnormal: values at or below round to zero
    smallest_subnormal: float
    smallest_normal: float
    largest: float

    @classmethod
    def of(cls, fmt: Format) -> "Thresholds":
        return cls(fmt.smallest_subnormal / 2, fmt.smallest_subnormal, fmt.tiny, fmt.max)


def _exponent_bins(tf, a):
    """Bin index of floor(log2|a|) for float32 a, read exactly from the bits."""
    bits = tf.bitcast(a, tf.int32)
    exponent = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 23), 0xFF) - 127
    return tf.clip_by_value(exponent, HIST_MIN_EXPONENT - 1, HIST_MAX_EXPONENT) - (HIST_MIN_EXPONENT - 1)


def _histogram(tf, a, mask):
    """Counts per exponent bin of the elements of `a` where `mask` holds."""
    return tf.math.unsorted_segment_sum(tf.cast(mask, tf.int32), _exponent_bins(tf, a), N_BINS)


def _range_class(tf, x, zero, t: Thresholds):
    """0 zero, 1 subnormal, 2 normal, 3 beyond the format's range or non-finite."""
    return tf.where(zero, 0, tf.where(x < t.smallest_normal, 1, tf.where(x <= t.largest, 2, 3)))


def batched_stats(lows, shadows, thresholds: Thresholds):
    """The classification above for a list of tensors at once, as stacked arrays.

    All tensors are flattened into one vector with a segment id per tensor, so
    the graph has a fixed number of ops however many layers there are (XLA
    compiles it in seconds instead of minutes). Returns (counts [T, len(COUNT_FIELDS)] int32,
    extremes [T, 2] float32, hist_low [T, B] int32, hist_shadow [T, B] int32).
    """
    import tensorflow as tf

    t = len(lows)
    a = tf.abs(tf.concat([tf.reshape(tf.cast(x, tf.float32), [-1]) for x in lows], 0))
    s = tf.abs(tf.concat([tf.reshape(tf.cast(x, tf.float32), [-1]) for x in shadows], 0))
    seg = tf.concat([tf.fill([tf.size(x)], i) for i, x in enumerate(lows)], 0)
    finite = tf.math.is_finite(a)
    low_zero = tf.equal(a, 0.0)
    shadow_zero = tf.equal(s, 0.0)
    under = tf.logical_and(tf.logical_not(shadow_zero), s <= thresholds.flush_below)
    masks = [
        tf.ones_like(low_zero),
        tf.logical_and(low_zero, shadow_zero),
        tf.logical_and(low_zero, under),
        tf.logical_and(low_zero, tf.logical_and(tf.logical_not(shadow_zero), tf.logical_not(under))),
        # "nonzero and below the smallest normal" rather than ">= smallest subnormal": TensorFlow's
        # CPU threads run with denormals-are-zero, so an fp32 constant 2^-149 would compare as 0.
        tf.logical_and(tf.logical_not(low_zero), a < thresholds.smallest_normal),
        tf.math.is_inf(a),
        tf.math.is_nan(a),
        under,
        tf.logical_and(s > thresholds.flush_below, s < thresholds.smallest_normal),
        tf.not_equal(_range_class(tf, tf.where(tf.math.is_nan(a), np.inf, a), low_zero, thresholds),
                     _range_class(tf, tf.where(tf.math.is_nan(s), np.inf, s),
                                  tf.logical_or(shadow_zero, under), thresholds)),
    ]
    counts = tf.stack([tf.math.unsorted_segment_sum(tf.cast(m, tf.int32), seg, t) for m in masks], axis=1)
    nonzero_finite = tf.logical_and(finite, tf.logical_not(low_zero))
    inf = tf.constant(np.inf, tf.float32)
    extremes = tf.stack([
        tf.math.unsorted_segment_min(tf.where(nonzero_finite, a, inf), seg, t),
        tf.math.unsorted_segment_max(tf.where(finite, a, 0.0), seg, t),
    ], axis=1)

    def hist(values, mask):
        index = seg * N_BINS + _exponent_bins(tf, values)
        flat = tf.math.unsorted_segment_sum(tf.cast(mask, tf.int32), index, t * N_BINS)
        return tf.reshape(flat, [t, N_BINS])

    shadow_ok = tf.logical_and(tf.math.is_finite(s), tf.logical_not(shadow_zero))
    return (counts, extremes, hist(tf.where(finite, a, 0.0), nonzero_finite),
            hist(tf.where(tf.math.is_finite(s), s, 0.0), shadow_ok))


def numpy_tensor_stats(low: np.ndarray, shadow: np.ndarray, thresholds: Thresholds) -> dict:
    """The same classification in NumPy (an independent reference for the tests)."""
    a = np.abs(np.asarray(low, dtype=np.float64)).ravel()
    s = np.abs(np.asarray(shadow, dtype=np.float64)).ravel()
    with np.errstate(invalid="ignore"):
        under = (s != 0) & (s <= thresholds.flush_below)
        out = {
            "n": a.size,
            "routing_zero": int(np.sum((a == 0) & (s == 0))),
            "flushed": int(np.sum((a == 0) & under)),
            "lost": int(np.sum((a == 0) & (s != 0) & ~under)),
            "subnormal": int(np.sum((a != 0) & (a < thresholds.smallest_normal))),
            "inf": int(np.sum(np.isinf(a))),
            "nan": int(np.sum(np.isnan(a))),
            "shadow_underflow": int(np.sum(under)),
            "shadow_subnormal": int(np.sum((s > thresholds.flush_below) & (s < thresholds.smallest_normal))),
            "class_mismatch": int(np.sum(_np_class(a, a == 0, thresholds) != _np_class(s, (s == 0) | under, thresholds))),
        }
    return out


def _np_class(x, zero, t: Thresholds):
    x = np.where(np.isnan(x), np.inf, x)
    return np.where(zero, 0, np.where(x < t.smallest_normal, 1, np.where(x <= t.largest, 2, 3)))


def encode_histogram(counts) -> str:
    """Compact CSV cell: 'exponent:count' for nonzero bins, ';'-separated."""
    labels = histogram_edges()
    return ";".join(f"{labels[i]}:{int(c)}" for i, c in enumerate(counts) if c)


def decode_histogram(text) -> dict[int, int]:
    """Inverse of `encode_histogram`: {exponent label: count}."""
    if not isinstance(text, str) or not text:
        return {}
    return {int(k): int(v) for k, v in (item.split(":") for item in text.split(";"))}
