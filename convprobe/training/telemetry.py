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

Counterfactual formats (`counterfactual_stats`; `batched_stats` counts them in its own pass): from the same fp32 shadow, at the
same loss scale, how many elements would flush or land subnormal had the gradient
been held in bf16, fp8_e4m3 or fp8_e5m2 (Transformer Engine's "what would another
recipe underflow"), with no second run. They say nothing of what the other format's
own forward and backward arithmetic would have changed upstream.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from convprobe.emulation._threads import over_items
from convprobe.formats import FP16, Format, parse_format
from convprobe.training import _telemetry_kernel

__all__ = [
    "COUNT_FIELDS",
    "HIST_MIN_EXPONENT",
    "HIST_MAX_EXPONENT",
    "Thresholds",
    "histogram_edges",
    "batched_stats",
    "use_host_tables",
    "numpy_tensor_stats",
    "encode_histogram",
    "decode_histogram",
    "COUNTERFACTUAL_FORMATS",
    "COUNTERFACTUAL_FIELDS",
    "counterfactual_stats",
    "nonfinite_counts",
    "backward_order",
]

#: Formats the shadow is measured against besides the run's own (`counterfactual_stats`).
COUNTERFACTUAL_FORMATS = ("bf16", "fp8_e4m3", "fp8_e5m2")
#: Counts per tensor of `counterfactual_stats`, in this order: per format, flushed then subnormal.
COUNTERFACTUAL_FIELDS = tuple(f"{fmt}_{what}" for fmt in COUNTERFACTUAL_FORMATS for what in ("flushed", "subnormal"))

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


#: fp16's thresholds: a tensor of fp16 classified against them is read on its bit patterns.
_FP16_THRESHOLDS = Thresholds.of(FP16)


def _exponent_bins(tf, a):
    """Bin index of floor(log2|a|) for float32 a, read exactly from the bits."""
    bits = tf.bitcast(a, tf.int32)
    exponent = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 23), 0xFF) - 127
    return tf.clip_by_value(exponent, HIST_MIN_EXPONENT - 1, HIST_MAX_EXPONENT) - (HIST_MIN_EXPONENT - 1)


# Joint classes: every element gets one code (low class, shadow class, low exponent
# bin, shadow exponent bin), so a single scatter-add per tensor counts everything;
# the count fields and both histograms are sums over that table. (XLA's CPU scatter
# is a serial loop: one pass over the elements instead of twelve.)
#   low class:    0 zero, 1 subnormal (nonzero, below the smallest normal), 2 normal,
#                 3 inf, 4 nan
#   shadow class: 0 exactly zero, 1 rounds to zero (0 < |s| <= flush_below),
#                 2 subnormal, 3 normal (<= largest), 4 finite beyond the range, 5 non-finite
_N_LOW, _N_SHADOW = 5, 6
_LOW_RANGE = (0, 1, 2, 3, 3)  # class -> range class (zero, subnormal, normal, non-finite/beyond)
_SHADOW_RANGE = (0, 0, 1, 2, 3, 3)


def _field_matrix() -> np.ndarray:
    """[_N_LOW * _N_SHADOW, len(COUNT_FIELDS)] 0/1: which joint classes each count field sums."""
    m = np.zeros((_N_LOW * _N_SHADOW, len(COUNT_FIELDS)), dtype=np.int32)
    f = {name: i for i, name in enumerate(COUNT_FIELDS)}
    for low in range(_N_LOW):
        for sh in range(_N_SHADOW):
            code = low * _N_SHADOW + sh
            m[code, f["n"]] = 1
            m[code, f["routing_zero"]] = low == 0 and sh == 0
            m[code, f["flushed"]] = low == 0 and sh == 1
            m[code, f["lost"]] = low == 0 and sh >= 2
            m[code, f["subnormal"]] = low == 1
            m[code, f["inf"]] = low == 3
            m[code, f["nan"]] = low == 4
            m[code, f["shadow_underflow"]] = sh == 1
            m[code, f["shadow_subnormal"]] = sh == 2
            m[code, f["class_mismatch"]] = _LOW_RANGE[low] != _SHADOW_RANGE[sh]
    return m


def _tensor_tables(tf, low, shadow, thresholds: Thresholds):
    """One tensor's two tables: (joint int32 [_N_LOW, _N_SHADOW, N_BINS] over (low class,
    shadow class, low exponent bin), shadow int32 [N_BINS + 1, buckets] over the shadow's
    exponent bin and its counterfactual bucket (`_counterfactual_buckets`)).

    The low bin is that of |low| where it is finite (0 for non-finite), the shadow bin that of
    |shadow| where it is finite and nonzero, else the extra last bin. Two scatter-adds into
    tables that stay in cache; the histograms and the counterfactual counts need only their
    marginals, so no table over both exponents is filled and reduced again.
    """
    s = tf.abs(tf.reshape(tf.cast(shadow, tf.float32), [-1]))
    low_class, low_bin = (_fp16_low_codes(tf, low) if low.dtype == tf.float16 and thresholds == _FP16_THRESHOLDS
                          else _low_codes(tf, low, thresholds))
    s_finite = tf.math.is_finite(s)
    shadow_class = tf.where(
        tf.logical_not(s_finite), 5, tf.where(
            tf.equal(s, 0.0), 0, tf.where(
                s <= thresholds.flush_below, 1, tf.where(
                    s < thresholds.smallest_normal, 2, tf.where(s <= thresholds.largest, 3, 4)))))
    shadow_bin = tf.where(tf.logical_and(s_finite, tf.not_equal(s, 0.0)),
                          _exponent_bins(tf, tf.where(s_finite, s, 1.0)), N_BINS)
    bounds = _counterfactual_buckets()[0]
    bucket = _bucket(tf, tf.bitcast(s, tf.int32), bounds)
    ones = tf.ones_like(low_bin)
    joint = tf.math.unsorted_segment_sum(ones, (low_class * _N_SHADOW + shadow_class) * N_BINS + low_bin,
                                         _N_LOW * _N_SHADOW * N_BINS)
    shadow_table = tf.math.unsorted_segment_sum(ones, shadow_bin * (len(bounds) + 1) + bucket,
                                                (N_BINS + 1) * (len(bounds) + 1))
    return (tf.reshape(joint, [_N_LOW, _N_SHADOW, N_BINS]), tf.reshape(shadow_table, [N_BINS + 1, len(bounds) + 1]))


def _low_codes(tf, low, thresholds: Thresholds):
    """(low class, low exponent bin) of every element of `low`, from its float32 value: the
    bin of |low| where it is finite, of 1.0 (bin of exponent 0) where it is not."""
    a = tf.abs(tf.reshape(tf.cast(low, tf.float32), [-1]))
    low_class = tf.where(
        tf.math.is_nan(a), 4, tf.where(
            tf.math.is_inf(a), 3, tf.where(
                tf.equal(a, 0.0), 0, tf.where(a < thresholds.smallest_normal, 1, 2))))
    return low_class, _exponent_bins(tf, tf.where(tf.math.is_finite(a), a, 1.0))


def _fp16_low_codes(tf, low):
    """`_low_codes` of an fp16 tensor read on its bit patterns, with no float conversion (XLA
    converts fp16 to float32 on the CPU one element at a time): with the sign cleared, above
    0x7C00 is NaN, 0x7C00 inf, below 0x0400 subnormal; floor(log2|low|) is the exponent
    field less 15, or for a subnormal m * 2**-24 the top bit of m less 24, read from the
    float32 of the integer m (exact)."""
    bits = tf.bitwise.bitwise_and(tf.cast(tf.bitcast(tf.reshape(low, [-1]), tf.int16), tf.int32), 0x7FFF)
    low_class = tf.where(bits > 0x7C00, 4, tf.where(
        tf.equal(bits, 0x7C00), 3, tf.where(tf.equal(bits, 0), 0, tf.where(bits < 0x0400, 1, 2))))
    field = tf.bitwise.right_shift(bits, 10)
    top_bit = tf.bitwise.right_shift(tf.bitcast(tf.cast(tf.bitwise.bitwise_and(bits, 0x3FF), tf.float32), tf.int32),
                                     23) - 127
    exponent = tf.where(low_class >= 3, 0, tf.where(field > 0, field - 15, top_bit - 24))
    return low_class, tf.clip_by_value(exponent, HIST_MIN_EXPONENT - 1, HIST_MAX_EXPONENT) - (HIST_MIN_EXPONENT - 1)


def zeros_for_none(grads, targets) -> list:
    """Gradients with None (a tensor the loss does not reach: a tapped layer whose output is
    also the model's, say) replaced by zeros, which every count reads as zero."""
    import tensorflow as tf

    return [tf.zeros_like(t) if g is None else g for g, t in zip(grads, targets)]


def batched_stats(lows, shadows, thresholds: Thresholds, host: bool = False):
    """The classification above for a list of tensors at once, as stacked arrays.

    Each tensor gets its own two tables (`_tensor_tables`), filled by scatter-adds
    (XLA's CPU scatter is a serial loop, but one pass over the elements instead of
    twelve); the count fields, both histograms and the counterfactual counts are sums
    over them. `host`: the tables and extremes are counted by one compiled loop on the
    host instead, a tensor per thread (`_telemetry_kernel`, through `tf.numpy_function`: not under XLA; see
    `use_host_tables`), the sums are the same; where it cannot read the tensors or the
    thresholds exactly (`_host_reads`: a float64 tensor, fp64's thresholds) the tables
    are counted as without it.
    Returns (counts [T, len(COUNT_FIELDS)] int32, extremes [T, 2] float32,
    hist_low [T, B] int32, hist_shadow [T, B] int32, counterfactual [T,
    len(COUNTERFACTUAL_FIELDS)] int32: what `counterfactual_stats` counts, from the same pass).

    "Subnormal" is tested as "nonzero and below the smallest normal" rather than
    ">= smallest subnormal": TensorFlow's CPU threads run with
    denormals-are-zero, so an fp32 constant 2^-149 would compare as 0.
    """
    import tensorflow as tf

    if host and _host_reads(lows, shadows, thresholds):
        joint, shadow, extremes = _host_tables(tf, lows, shadows, thresholds)
    else:
        tables = [_tensor_tables(tf, x, s, thresholds) for x, s in zip(lows, shadows)]
        joint = tf.stack([table for table, _ in tables])  # [T, _N_LOW, _N_SHADOW, N_BINS]
        shadow = tf.stack([table for _, table in tables])  # [T, N_BINS + 1, buckets]
        extremes = tf.stack([_extremes(tf, low) for low in lows])
    counts = tf.matmul(tf.reshape(tf.reduce_sum(joint, axis=3), [len(lows), _N_LOW * _N_SHADOW]),
                       tf.constant(_field_matrix()))
    hist_low = tf.reduce_sum(joint[:, 1:3], axis=[1, 2])  # low finite nonzero
    hist_shadow = tf.reduce_sum(shadow[:, :N_BINS], axis=2)  # shadow finite nonzero
    counterfactual = tf.matmul(tf.reduce_sum(shadow, axis=1), tf.constant(_counterfactual_buckets()[1]))
    return counts, extremes, hist_low, hist_shadow, counterfactual


def use_host_tables(jit: bool) -> bool:
    """Whether `batched_stats` should count on the host: the step is not compiled by XLA
    (`tf.numpy_function` cannot be) and no GPU holds the gradients (no copy to the host)."""
    import tensorflow as tf

    return not jit and not tf.config.list_logical_devices("GPU")


def _host_reads(lows, shadows, thresholds: Thresholds) -> bool:
    """Whether the host loop reads every tensor and threshold exactly on fp32 patterns: fp16,
    bf16 or fp32 tensors, and a smallest normal and a largest value that are normal fp32 numbers."""
    fp32 = np.finfo(np.float32)
    exact = all(fp32.tiny <= v <= fp32.max and float(np.float32(v)) == v
                for v in (thresholds.smallest_normal, thresholds.largest))
    return exact and all(t.dtype.name in _telemetry_kernel.DTYPES for t in [*lows, *shadows])


def _host_tables(tf, lows, shadows, thresholds: Thresholds):
    """`batched_stats`' joint and shadow tables and extremes, from `_telemetry_kernel.fill_tables`."""
    bounds = tuple(np.int32(b) for b in _counterfactual_buckets()[0])
    patterns = tuple(np.int32(_fp32_bits(v) & 0x7FFFFFFF)
                     for v in (thresholds.flush_below, thresholds.smallest_normal, thresholds.largest))
    n = len(lows)

    def count(*tensors):
        joint = np.zeros((n, _N_LOW * _N_SHADOW * N_BINS), np.int32)
        shadow = np.zeros((n, (N_BINS + 1) * (len(bounds) + 1)), np.int32)
        extremes = np.zeros((n, 2), np.uint32)
        for t in range(n):
            if tensors[t].size != tensors[n + t].size:
                raise ValueError(f"tensor {t} has {tensors[t].size} elements and its shadow {tensors[n + t].size}")

        def fill(t):
            bits, kind = _telemetry_kernel.low_bits(tensors[t])
            shadow_bits = np.ascontiguousarray(tensors[n + t], dtype=np.float32).reshape(-1).view(np.uint32)
            _telemetry_kernel.fill_tables(bits, kind, shadow_bits, patterns, bounds, np.int32(HIST_MIN_EXPONENT),
                                          np.int32(HIST_MAX_EXPONENT), np.int32(_N_SHADOW), joint[t], shadow[t],
                                          extremes[t])

        # The kernel releases the GIL and each tensor fills its own rows: the cores the step
        # leaves idle while it waits on this op share the tensors, largest first.
        over_items(fill, sorted(range(n), key=lambda t: -tensors[t].size))
        return (joint.reshape(n, _N_LOW, _N_SHADOW, N_BINS), shadow.reshape(n, N_BINS + 1, len(bounds) + 1),
                extremes.view(np.float32))

    joint, shadow, extremes = tf.numpy_function(count, list(lows) + list(shadows),
                                                [tf.int32, tf.int32, tf.float32], stateful=False)
    joint.set_shape([n, _N_LOW, _N_SHADOW, N_BINS])
    shadow.set_shape([n, N_BINS + 1, len(bounds) + 1])
    extremes.set_shape([n, 2])
    return joint, shadow, extremes


#: The unsigned integer type of each float dtype's bit patterns, by width.
_BITS = {2: "uint16", 4: "uint32", 8: "uint64"}


def _extremes(tf, low):
    """float32 [2]: the smallest nonzero and the largest finite |low| (inf and 0 where there is
    none), read on the bit patterns: with the sign cleared, their order is the magnitudes',
    and no element is converted (XLA converts fp16 on the CPU element by element, at a cost
    that dominated these statistics)."""
    dtype = np.dtype(low.dtype.as_numpy_dtype)
    unsigned = np.dtype(_BITS[dtype.itemsize])
    as_bits = getattr(tf, unsigned.name)
    largest = tf.constant(int(np.array(np.finfo(dtype).max, dtype).view(unsigned)), as_bits)
    magnitude = tf.constant((1 << (8 * dtype.itemsize - 1)) - 1, as_bits)  # every bit but the sign
    bits = tf.bitwise.bitwise_and(tf.bitcast(tf.reshape(low, [-1]), as_bits), magnitude)
    finite = bits <= largest
    # (inf's bits; the minimum of no element is the type's largest: an empty tensor's too)
    smallest = tf.minimum(tf.reduce_min(tf.where(tf.logical_and(finite, bits > 0), bits, largest + 1)), largest + 1)
    biggest = tf.reduce_max(tf.where(finite, bits, tf.zeros_like(bits)))
    as_float = tf.bitcast(tf.stack([smallest, biggest]), low.dtype)
    return tf.cast(as_float, tf.float32)


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
    """Range class in NumPy: 0 zero, 1 subnormal, 2 normal, 3 beyond the range or non-finite."""
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


def _fp32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.int32))


def counterfactual_stats(shadows):
    """int32 [T, len(COUNTERFACTUAL_FIELDS)]: per tensor, how many fp32 shadow values |S*g|
    would flush (0 < |s| <= half the smallest subnormal) or land subnormal (up to the
    smallest normal) in each of `COUNTERFACTUAL_FORMATS`.

    Compared on the fp32 bit patterns (for non-negative floats their order is the
    numbers'): bf16's thresholds are fp32 subnormals, which TensorFlow's CPU threads
    (denormals-are-zero) would compare as 0. On such a CPU the shadow itself holds no
    fp32 subnormal, so bf16 (fp32's exponent range) counts only what fp32 kept.
    """
    import tensorflow as tf

    bounds, fields = _counterfactual_buckets()
    rows = []
    for shadow in shadows:
        bits = tf.bitwise.bitwise_and(tf.bitcast(tf.reshape(tf.cast(shadow, tf.float32), [-1]), tf.int32),
                                      0x7FFFFFFF)
        bucket = _bucket(tf, bits, bounds)
        rows.append(tf.math.unsorted_segment_sum(tf.ones_like(bucket), bucket, len(bounds) + 1))
    return tf.matmul(tf.stack(rows), tf.constant(fields))


def _bucket(tf, bits, bounds: list[int]):
    """How many of `bounds` lie below each magnitude's fp32 bit pattern (sign cleared)."""
    return tf.add_n([tf.cast(bits > bound, tf.int32) for bound in bounds])


@functools.cache
def _counterfactual_buckets() -> tuple[list[int], np.ndarray]:
    """(the sorted fp32 bit patterns b that bucket |s| by how many satisfy bits > b, int32
    [buckets, len(COUNTERFACTUAL_FIELDS)] 0/1: which buckets each field sums). A format flushes
    0 < bits <= flush and lands subnormal flush < bits < normal, i.e. bits <= normal - 1: one
    pass and one scatter-add per tensor count every format's two fields."""
    limits = []
    for name in COUNTERFACTUAL_FORMATS:
        t = Thresholds.of(parse_format(name))
        limits.append((_fp32_bits(t.flush_below), _fp32_bits(t.smallest_normal) - 1))
    bounds = sorted({0, *(b for pair in limits for b in pair)})
    fields = np.zeros((len(bounds) + 1, len(COUNTERFACTUAL_FIELDS)), dtype=np.int32)
    for f, (flush, normal) in enumerate(limits):  # bucket k holds bounds[k - 1] < bits <= bounds[k]
        for k in range(1, len(bounds) + 1):
            low, high = bounds[k - 1], bounds[k] if k < len(bounds) else None
            fields[k, 2 * f] = low >= 0 and high is not None and high <= flush
            fields[k, 2 * f + 1] = low >= flush and high is not None and high <= normal
    return bounds, fields


def nonfinite_counts(grads):
    """int32 [T]: non-finite elements of each gradient (None counts 0): which tensors overflowed."""
    import tensorflow as tf

    return tf.stack([tf.constant(0, tf.int32) if g is None else
                     tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(g)), tf.int32)) for g in grads])


def backward_order(model, variables, activation_layers) -> list[int]:
    """Positions of the tensors (`variables`, then the outputs of `activation_layers`, by
    name) in the order the backward pass computes their gradients: layers from the output
    back (the model's layer order, topological for a functional model), a layer's output
    gradient before its weights'. A tensor of no layer of `model` goes last."""
    position: dict[int, int] = {}
    named: dict[str, int] = {}
    for i, layer in enumerate(_all_layers(model)):
        named.setdefault(layer.name, i)
        for v in layer.trainable_weights:
            position.setdefault(id(v), i)
    rank = [(-position.get(id(v), -1), 1) for v in variables] + \
           [(-named.get(name, -1), 0) for name in activation_layers]
    return sorted(range(len(rank)), key=lambda k: (rank[k][0] == 1, rank[k]))


def _all_layers(model):
    """Every layer, nested models' layers in place of the model (depth first)."""
    for layer in getattr(model, "layers", []):
        if getattr(layer, "layers", None):
            yield from _all_layers(layer)
        yield layer
