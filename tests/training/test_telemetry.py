"""Classification of gradients against their fp32 shadow, on crafted values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from convprobe.formats import FP16, FP32, parse_format
from convprobe.training._telemetry_kernel import LowBits, _fp16_magnitude, _wide_magnitude, fp16_at_or_above, low_bits
from convprobe.training.telemetry import (
    COUNT_FIELDS,
    COUNTERFACTUAL_FORMATS,
    Thresholds,
    batched_stats,
    counterfactual_stats,
    decode_histogram,
    encode_histogram,
    histogram_edges,
    _host_reads,
    numpy_tensor_stats,
)

T16 = Thresholds.of(FP16)
TINY_SUB = FP16.smallest_subnormal  # 2**-24
# (low-precision value, fp32 shadow value, expected categories)
CASES = [
    (0.0, 0.0, {"routing_zero"}),
    (0.0, 2.0**-26, {"flushed", "shadow_underflow"}),
    (0.0, -(2.0**-25), {"flushed", "shadow_underflow"}),  # the tie rounds to even: zero
    (0.0, 2.0**-20, {"lost", "shadow_subnormal", "class_mismatch"}),
    (TINY_SUB, 1.5 * 2.0**-25, {"subnormal", "shadow_subnormal"}),
    (-(2.0**-15), 3 * 2.0**-16, {"subnormal", "shadow_subnormal"}),
    (2.0**-14, 2.0**-14, set()),
    (65504.0, 65504.0, set()),
    (np.inf, 70000.0, {"inf"}),
    (np.nan, 1.0, {"nan", "class_mismatch"}),
    (1.0, 2.0**-30, {"shadow_underflow", "class_mismatch"}),
    (2.0**-14 - 2.0**-24, 2.0**-13, {"subnormal", "class_mismatch"}),
]


def _reference_extremes(x) -> list[float]:
    """[smallest nonzero, largest finite] |x|, in float64: what the statistics' extremes hold."""
    a = np.abs(np.asarray(x, np.float64)).ravel()
    finite = a[np.isfinite(a)]
    return [finite[finite != 0].min(), finite.max()]


def _reference_histogram(x) -> dict[int, int]:
    """{floor(log2|x|), read exactly by frexp and clipped to the bins: count} over the finite
    nonzero values of x: what a decoded histogram holds."""
    a = np.abs(np.asarray(x, np.float64)).ravel()
    e = np.clip(np.frexp(a[np.isfinite(a) & (a != 0)])[1] - 1, histogram_edges()[0], histogram_edges()[-1])
    return {int(k): int(v) for k, v in zip(*np.unique(e, return_counts=True))}


def expected_counts():
    want = dict.fromkeys(COUNT_FIELDS, 0)
    want["n"] = len(CASES)
    for _, _, cats in CASES:
        for c in cats:
            want[c] += 1
    return want


def test_thresholds_of_fp16():
    assert (T16.flush_below, T16.smallest_subnormal, T16.smallest_normal, T16.largest) == (
        2.0**-25, 2.0**-24, 2.0**-14, 65504.0)


def test_numpy_reference_on_crafted_values():
    low = np.array([c[0] for c in CASES], dtype=np.float16)
    shadow = np.array([c[1] for c in CASES], dtype=np.float32)
    assert numpy_tensor_stats(low, shadow, T16) == expected_counts()


@pytest.mark.parametrize(("jit", "host"), [(False, False), (True, False), (False, True)], ids=["graph", "xla", "host"])
@pytest.mark.tensorflow
def test_batched_stats_matches_reference_exactly(jit, host):
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)
    crafted_low = np.array([c[0] for c in CASES], dtype=np.float16)
    crafted_shadow = np.array([c[1] for c in CASES], dtype=np.float32)
    # Random tensors spanning the whole fp16 range, with their own shadows.
    shadow_r = (rng.standard_normal((3, 5, 7)) * 2.0 ** rng.integers(-32, 10, (3, 5, 7))).astype(np.float32)
    low_r = shadow_r.astype(np.float16)
    low_r[0, 0, :3] = 0
    fp32_low = shadow_r[2].copy()  # a tensor computed in fp32 (a batch-norm weight): its extremes from 32-bit patterns
    fp32_low[0, :2] = (np.inf, np.nan)
    every_fp16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)  # all 65,536 code points
    with np.errstate(over="ignore", invalid="ignore"):
        every_shadow = (every_fp16.astype(np.float32) * rng.uniform(0.5, 2.0, every_fp16.size)).astype(np.float32)
    lows = [crafted_low, low_r, low_r[1], fp32_low, every_fp16]
    shadows = [crafted_shadow, shadow_r, shadow_r[1], shadow_r[2], every_shadow]
    fn = tf.function(lambda a, b: batched_stats(a, b, T16, host=host), jit_compile=jit)
    counts, extremes, hist_low, hist_shadow, counterfactual = (np.asarray(x) for x in fn(
        [tf.constant(x) for x in lows], [tf.constant(x) for x in shadows]))
    # the counterfactual counts from the same pass as the standalone count's, fp32 subnormal
    # shadows included (bf16 counts them; TensorFlow's CPU compares would read them as 0)
    assert np.array_equal(counterfactual, counterfactual_stats([tf.constant(x) for x in shadows]).numpy())
    tiny = np.array([2.0**-133, -(2.0**-140), 2.0**-149, 2.0**-126, 2.0**-127, 0.0, 1.0], np.float32)
    fused = fn([tf.constant(tiny.astype(np.float16))], [tf.constant(tiny)])[4].numpy()
    magnitudes = np.abs(tiny.astype(np.float64))  # (float64: no denormals-are-zero here)
    want = []
    for name in COUNTERFACTUAL_FORMATS:  # each format's own thresholds: flushed, then subnormal
        t = Thresholds.of(parse_format(name))
        want += [int(np.sum((magnitudes > 0) & (magnitudes <= t.flush_below))),
                 int(np.sum((magnitudes > t.flush_below) & (magnitudes < t.smallest_normal)))]
    assert fused[0].tolist() == want, (fused, want)
    assert np.array_equal(fused, counterfactual_stats([tf.constant(tiny)]).numpy())
    for t, (lo, sh) in enumerate(zip(lows, shadows)):
        assert dict(zip(COUNT_FIELDS, counts[t].tolist())) == numpy_tensor_stats(lo, sh, T16)
        assert extremes[t].tolist() == _reference_extremes(lo)
        assert decode_histogram(encode_histogram(hist_low[t])) == _reference_histogram(lo)
        want = _reference_histogram(sh)
        assert hist_shadow[t].sum() == sum(want.values())
        assert decode_histogram(encode_histogram(hist_shadow[t])) == want
    assert counts[0].tolist() == [expected_counts()[f] for f in COUNT_FIELDS]


@pytest.mark.tensorflow
def test_host_tables_read_fp32_subnormals_as_the_reference_does():
    """The host loop compares bit patterns only: an fp32 subnormal shadow or low value (which a
    denormals-are-zero compare reads as 0) is counted as the NumPy reference counts it, in
    bf16 and fp32 runs too, with the extremes and histograms it belongs to."""
    import tensorflow as tf

    rng = np.random.default_rng(7)
    magnitudes = 2.0 ** rng.integers(-149, 10, 4000).astype(np.float64) * rng.uniform(1, 2, 4000)
    shadow = (magnitudes * rng.choice([-1, 1], 4000)).astype(np.float32)
    shadow[:40] = (np.arange(1, 41, dtype=np.uint32) << 16).view(np.float32)  # fp32 (and bf16) subnormals, by bits
    shadow[40:43] = (0.0, np.inf, np.nan)
    as_bf16 = (shadow.view(np.uint32) >> 16).astype(np.uint16).view(ml_dtypes.bfloat16)  # truncated, by bits
    for fmt, low in (("bf16", as_bf16), ("fp32", shadow.copy())):
        thresholds = Thresholds.of(parse_format(fmt))
        assert np.any(low.astype(np.float32)[:40] != 0)  # subnormal low values in both formats
        fn = tf.function(lambda a, b, t=thresholds: batched_stats(a, b, t, host=True))
        counts, extremes, hist_low, _, counterfactual = (np.asarray(x) for x in fn(
            [tf.constant(low)], [tf.constant(shadow)]))
        assert dict(zip(COUNT_FIELDS, counts[0].tolist())) == numpy_tensor_stats(low, shadow, thresholds), fmt
        assert extremes[0].tolist() == _reference_extremes(low), fmt
        assert hist_low[0].sum() == sum(_reference_histogram(low).values()), fmt
        assert np.array_equal(counterfactual, counterfactual_stats([tf.constant(shadow)]).numpy()), fmt


@pytest.mark.tensorflow
@pytest.mark.parametrize("fmt, float64_tensor", [("fp16", False), ("bf16", False), ("fp32", False), ("fp64", False),
                                                 ("fp16", True)])
def test_the_graph_xla_and_host_paths_give_the_same_statistics(fmt, float64_tensor):
    """Each path's every output, for each format's thresholds, on signed values spread over
    exponents with fp16 subnormals, zeros, infinities and NaN (no fp32 subnormal: a CPU's
    compares read those as zero), and an empty tensor. fp64's thresholds and a float64
    tensor are beyond the host loop's fp32 patterns: it counts them as the others do."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    shadow = (rng.standard_normal(5000) * 2.0 ** rng.integers(-60, 20, 5000)).astype(np.float32)
    shadow[:4] = (0.0, -0.0, np.inf, np.nan)
    with np.errstate(over="ignore"):
        low = shadow.astype(np.float16)
    low[10:20] = 0  # flushed and lost values
    # tensors of different sizes and values: the host loop's threads fill each one's own rows
    lows = [low, shadow.reshape(50, 100), np.zeros(0, np.float16), low[::-3].copy(), low[7:100].copy()]
    shadows = [shadow, shadow.reshape(50, 100), np.zeros(0, np.float32), shadow[::-3].copy(), shadow[7:100].copy()]
    if float64_tensor:
        lows.append(shadow.astype(np.float64))
        shadows.append(shadow)
    thresholds = Thresholds.of(parse_format(fmt))
    results = {}
    for name, jit, host in (("graph", False, False), ("xla", True, False), ("host", False, True)):
        fn = tf.function(lambda a, b, host=host: batched_stats(a, b, thresholds, host=host), jit_compile=jit)
        with np.errstate(over="ignore"):  # fp64's largest as a float32 constant: inf
            results[name] = [np.asarray(x) for x in fn([tf.constant(x) for x in lows],
                                                         [tf.constant(x) for x in shadows])]
    for name in ("xla", "host"):
        for field, want, got in zip(("counts", "extremes", "hist_low", "hist_shadow", "counterfactual"),
                                    results["graph"], results[name]):
            assert np.array_equal(want, got, equal_nan=True), (name, field, want, got)
    assert results["host"][1][2].tolist() == [np.inf, 0.0]  # an empty tensor's extremes
    reads = _host_reads([tf.constant(x) for x in lows], [tf.constant(x) for x in shadows], thresholds)
    assert reads == (fmt != "fp64" and not float64_tensor)


def test_fp32_never_flushes():
    t32 = Thresholds.of(FP32)
    x = np.array([0.0, 2.0**-126, 2.0**-149, 1.0], dtype=np.float32)
    got = numpy_tensor_stats(x, x, t32)
    assert got["flushed"] == 0 and got["shadow_underflow"] == 0 and got["class_mismatch"] == 0
    assert got["subnormal"] == 1 and got["routing_zero"] == 1


def test_counterfactual_formats_agree_with_ml_dtypes_casts():
    """A shadow value flushes in a format exactly when ml_dtypes rounds it to zero there, and
    lands subnormal when the rounded value is nonzero and below the format's smallest normal
    (the bit-pattern comparison sees fp32 subnormals that a DAZ CPU would compare as 0)."""
    import tensorflow as tf

    from convprobe.formats import parse_format
    from convprobe.training.telemetry import COUNTERFACTUAL_FIELDS, COUNTERFACTUAL_FORMATS, counterfactual_stats

    exponents = np.arange(-148, 12)
    magnitudes = np.concatenate([2.0**exponents * m for m in (1.0, 1.25, 1.5)] + [[0.0, np.inf, np.nan]])
    values = (magnitudes * np.where(np.arange(magnitudes.size) % 2, -1, 1)).astype(np.float32)
    got = counterfactual_stats([tf.constant(values)]).numpy()[0]
    dtypes = {"bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
    finite = values[np.isfinite(values) & (values != 0)]
    for name in COUNTERFACTUAL_FORMATS:
        fmt = parse_format(name)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.abs(finite.astype(dtypes[name]).astype(np.float64))
        # below the band [tiny - half a subnormal step, tiny) that rounds up to the smallest normal
        # (none of the values above lies in it, so the count is the cast's exactly)
        inside = np.abs(finite) < fmt.tiny - fmt.smallest_subnormal / 2
        assert not np.any((np.abs(finite) >= fmt.tiny - fmt.smallest_subnormal / 2) & (np.abs(finite) < fmt.tiny))
        expected = {f"{name}_flushed": int(np.sum(cast == 0)),
                    f"{name}_subnormal": int(np.sum(inside & (cast != 0) & (cast < fmt.tiny)))}
        for field, count in expected.items():
            assert got[COUNTERFACTUAL_FIELDS.index(field)] == count, (field, count)
        assert expected[f"{name}_flushed"] > 0 and expected[f"{name}_subnormal"] > 0


def test_nonfinite_counts_and_backward_order_name_the_output_side_first():
    import keras
    import tensorflow as tf

    from convprobe.training.telemetry import backward_order, nonfinite_counts

    counts = nonfinite_counts([tf.constant([1.0, np.inf, np.nan]), None, tf.constant([0.0])]).numpy()
    assert counts.tolist() == [2, 0, 0]
    x = keras.Input((4,))
    h = keras.layers.Dense(3, name="first")(x)
    y = keras.layers.Dense(2, name="second")(h)
    model = keras.Model(x, y)
    variables = model.trainable_variables  # first/kernel, first/bias, second/kernel, second/bias
    order = backward_order(model, variables, ["first", "second"])
    # second's output gradient, second's weights, first's output gradient, first's weights
    assert order == [5, 2, 3, 4, 0, 1]


def test_host_tables_widen_every_fp16_and_bf16_pattern_exactly():
    """The host loop's fp16 and bf16 patterns widened to fp32 patterns (fp16's for its
    thresholds and extremes, bf16's for its classes and bins): |x| exactly, at all 65,536
    patterns of each (subnormals, infinities and NaN payloads included)."""
    @njit
    def widen(bits, kind):
        out = np.empty(bits.size, np.int32)
        for i in range(bits.size):
            out[i] = _fp16_magnitude(bits[i]) if kind == LowBits.FP16 else _wide_magnitude(bits[i], np.int32(16))
        return out

    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for dtype, kind in ((np.float16, LowBits.FP16), (ml_dtypes.bfloat16, LowBits.BF16)):
        values = patterns.view(dtype)
        bits, got_kind = low_bits(values)
        assert got_kind == kind
        want = (np.abs(values.astype(np.float32)).view(np.uint32)).astype(np.int64)
        got = widen(bits, kind).astype(np.int64)
        wrong = np.flatnonzero(got != want)
        assert not wrong.size, (f"{wrong.size} {np.dtype(dtype).name} patterns widened wrongly, first "
                                f"{patterns[wrong[0]]:#06x}: {got[wrong[0]]:#010x} for {want[wrong[0]]:#010x}")


@pytest.mark.tensorflow
@pytest.mark.parametrize(("dtype", "fmt"), [(np.float16, "fp16"), (np.float16, "bf16"), (np.float16, "fp32"),
                                           (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.bfloat16, "fp32")],
                         ids=["fp16-fp16", "fp16-bf16", "fp16-fp32", "bf16-bf16", "bf16-fp32"])
def test_host_tables_count_every_fp16_and_bf16_pattern_as_the_reference_does(dtype, fmt):
    """The host loop reads an fp16 value on its own pattern and a bf16 value widened: at all
    65,536 patterns of each as the low value (signed, subnormals, infinities, NaN payloads),
    against shadows of either sign spread around it, its counts, extremes and histogram are
    the NumPy reference's under the thresholds of its own format and of each wider one (a
    finite value beyond the format's range is a run's inf, not a low value of it)."""
    import tensorflow as tf

    rng = np.random.default_rng(11)
    low = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    thresholds = Thresholds.of(parse_format(fmt))
    with np.errstate(over="ignore", invalid="ignore"):  # (casts of NaN payloads and of the largest values)
        wide = low.astype(np.float64)
        shadow = (wide * rng.choice([-1.0, 1.0], wide.size) * 2.0 ** rng.integers(-3, 4, wide.size)).astype(np.float32)
        reference = numpy_tensor_stats(low, shadow, thresholds)
    fn = tf.function(lambda a, b: batched_stats(a, b, thresholds, host=True))
    counts, extremes, hist_low, _, _ = (np.asarray(x) for x in fn([tf.constant(low)], [tf.constant(shadow)]))
    assert dict(zip(COUNT_FIELDS, counts[0].tolist())) == reference
    assert extremes[0].tolist() == _reference_extremes(wide)
    assert decode_histogram(encode_histogram(hist_low[0])) == _reference_histogram(wide)


def test_fp16_class_boundaries_are_found_on_fp16_patterns():
    """The smallest fp16 pattern at or above an fp32 threshold: at a pattern's own value, between
    two patterns, at fp32 subnormals and zero, and beyond fp16's largest (inf's pattern)."""
    finite = np.arange(0x7C01, dtype=np.uint32).astype(np.uint16).view(np.float16)  # 0 .. inf, ordered
    as_fp32 = finite.astype(np.float32).view(np.int32)
    thresholds = [0.0, 2.0**-149, 2.0**-25, 2.0**-24, 1.5 * 2.0**-24, 2.0**-14, np.nextafter(np.float32(2.0**-14), 0),
                  np.nextafter(np.float32(2.0**-14), 1), 1.0, 1.0 + 2.0**-11, 65504.0, 65504.0 + 2.0**-8, 65520.0,
                  2.0**100, float(np.finfo(np.float32).max)]
    for value in thresholds:
        pattern = np.float32(value).view(np.int32)
        want = int(np.searchsorted(as_fp32, pattern, side="left"))
        assert fp16_at_or_above(np.int32(pattern)) == want, (value, want)
    assert fp16_at_or_above(np.int32(np.float32(65504.0 + 2.0**-8).view(np.int32))) == 0x7C00
    assert fp16_at_or_above(np.int32(np.float32(2.0**-14).view(np.int32))) == 0x0400
