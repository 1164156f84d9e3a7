"""Classification of gradients against their fp32 shadow, on crafted values."""

from __future__ import annotations

import numpy as np
import pytest

from convprobe.formats import FP16, FP32
from convprobe.training.telemetry import (
    COUNT_FIELDS,
    Thresholds,
    batched_stats,
    decode_histogram,
    encode_histogram,
    histogram_edges,
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


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.tensorflow
def test_batched_stats_matches_reference_exactly(jit):
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)
    crafted_low = np.array([c[0] for c in CASES], dtype=np.float16)
    crafted_shadow = np.array([c[1] for c in CASES], dtype=np.float32)
    # Random tensors spanning the whole fp16 range, with their own shadows.
    shadow_r = (rng.standard_normal((3, 5, 7)) * 2.0 ** rng.integers(-32, 10, (3, 5, 7))).astype(np.float32)
    low_r = shadow_r.astype(np.float16)
    low_r[0, 0, :3] = 0
    lows = [crafted_low, low_r, low_r[1]]
    shadows = [crafted_shadow, shadow_r, shadow_r[1]]
    fn = tf.function(lambda a, b: batched_stats(a, b, T16), jit_compile=jit)
    counts, extremes, hist_low, hist_shadow = (np.asarray(x) for x in fn(
        [tf.constant(x) for x in lows], [tf.constant(x) for x in shadows]))
    for t, (lo, sh) in enumerate(zip(lows, shadows)):
        assert dict(zip(COUNT_FIELDS, counts[t].tolist())) == numpy_tensor_stats(lo, sh, T16)
        a = np.abs(lo.astype(np.float64)).ravel()
        ok = np.isfinite(a) & (a != 0)
        assert extremes[t, 0] == a[ok].min() and extremes[t, 1] == a[np.isfinite(a)].max()
        # Histogram: exact floor(log2|x|) via frexp, clipped to the bin range.
        e = np.clip(np.frexp(a[ok])[1] - 1, histogram_edges()[0], histogram_edges()[-1])
        want = {int(k): int(v) for k, v in zip(*np.unique(e, return_counts=True))}
        assert decode_histogram(encode_histogram(hist_low[t])) == want
        s = np.abs(sh.astype(np.float64)).ravel()
        s = s[np.isfinite(s) & (s != 0)]
        e = np.clip(np.frexp(s)[1] - 1, histogram_edges()[0], histogram_edges()[-1])
        assert hist_shadow[t].sum() == len(s)
        want = {int(k): int(v) for k, v in zip(*np.unique(e, return_counts=True))}
        assert decode_histogram(encode_histogram(hist_shadow[t])) == want
    assert counts[0].tolist() == [expected_counts()[f] for f in COUNT_FIELDS]


def test_fp32_never_flushes():
    t32 = Thresholds.of(FP32)
    x = np.array([0.0, 2.0**-126, 2.0**-149, 1.0], dtype=np.float32)
    got = numpy_tensor_stats(x, x, t32)
    assert got["flushed"] == 0 and got["shadow_underflow"] == 0 and got["class_mismatch"] == 0
    assert got["subnormal"] == 1 and got["routing_zero"] == 1
