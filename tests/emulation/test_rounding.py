"""round_to_format against ml_dtypes/NumPy casts (independent) and the Fraction oracle."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from convprobe.emulation import oracle, round_to_format
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FP64, FORMATS, custom_format

from .conftest import assert_same_bits

NARROW = [FP16, BF16, FP8_E4M3, FP8_E5M2]


def all_code_points(fmt):
    """Every finite value of a <=16-bit format, as float64, ascending (both zeros kept)."""
    bits = np.arange(2 ** fmt.bits, dtype=np.uint16 if fmt.bits == 16 else np.uint8)
    with np.errstate(invalid="ignore"):  # NaN code points (signalling ones warn)
        vals = bits.view(fmt.dtype).astype(np.float64)
    return vals[np.isfinite(vals)]


@pytest.mark.parametrize("fmt", NARROW, ids=lambda f: f.name)
def test_every_code_point_is_fixed(fmt):
    vals = all_code_points(fmt)
    assert_same_bits(round_to_format(vals, fmt), vals)


@pytest.mark.parametrize("fmt", NARROW, ids=lambda f: f.name)
def test_ties_and_neighbours_match_ml_dtypes(fmt):
    """Midpoints between neighbours (ties) and the midpoints +- one ulp of the carrier, incl.
    overflow. ml_dtypes converts float64 to bf16/fp8 through float32 (double rounding),
    so for those formats the probes are float32 values; NumPy's float64 -> float16
    cast is direct, so fp16 is probed with float64 neighbours."""
    vals = np.unique(all_code_points(fmt))
    mids = (vals[:-1] + vals[1:]) / 2  # exact: neighbours differ in <= p + 1 bits
    top = vals[-1] + (vals[-1] - vals[-2]) / 2  # max + half ulp: ties up to overflow
    probes = np.concatenate([mids, [top, 2 * top]])
    carrier = np.float64 if fmt is FP16 else np.float32
    with np.errstate(over="ignore"):  # bf16's 2 * (max + half ulp) is beyond float32
        c = probes.astype(carrier)
    up, down = np.nextafter(c, carrier(np.inf)), np.nextafter(c, carrier(-np.inf))
    probes = np.concatenate([probes, up.astype(np.float64), down.astype(np.float64)])
    probes = np.concatenate([probes, -probes, [np.inf, -np.inf, np.nan, 0.0, -0.0]])
    with np.errstate(over="ignore"):
        expected = probes.astype(fmt.dtype).astype(np.float64)
    assert_same_bits(round_to_format(probes, fmt), expected)


def test_fp32_matches_numpy_cast():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**64, size=200_000, dtype=np.uint64)
    vals = bits.view(np.float64)
    vals = vals[np.abs(vals) < 2.0**130]
    vals = np.concatenate([vals, np.ldexp(rng.standard_normal(100_000), rng.integers(-160, 130, 100_000))])
    with np.errstate(over="ignore"):
        expected = vals.astype(np.float32).astype(np.float64)
    assert_same_bits(round_to_format(vals, FP32), expected)


def test_fp64_is_identity():
    vals = np.array([0.0, -0.0, 5e-324, -2.2250738585072014e-308, 1.0, np.inf, 1.7976931348623157e308])
    assert_same_bits(round_to_format(vals, FP64), vals)


finite64 = st.floats(allow_nan=False, allow_infinity=False, width=64)
MODES = ["nearest_even", "toward_zero", "stochastic"]
EDGE = [0.0, -0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 65504.0,
        65520.0, 65519.99, 1 + 2.0**-11, 1 + 3 * 2.0**-11, math.inf, -math.inf, math.nan, 448.0,
        464.0, 57344.0, 61440.0, 2.0**-149, 2.0**-133, 3.4e38]


@settings(max_examples=150, deadline=None)
@given(values=st.lists(finite64 | st.sampled_from(EDGE), min_size=1, max_size=40),
       fmt=st.sampled_from([FP16, BF16, FP8_E4M3, FP8_E5M2, FP32, custom_format(5, 4),
                            custom_format(7, 20, subnormals=False)]),
       mode=st.sampled_from(MODES), subnormals=st.sampled_from(["keep", "flush"]),
       overflow=st.sampled_from(["inf", "saturate"]), seed=st.integers(0, 2**32))
@example(values=EDGE, fmt=FP16, mode="toward_zero", subnormals="flush", overflow="saturate", seed=0)
def test_matches_oracle_every_mode(values, fmt, mode, subnormals, overflow, seed):
    x = np.array(values, dtype=np.float64)
    got = round_to_format(x, fmt, mode, subnormals=subnormals, overflow=overflow, rng=seed)
    want = oracle.round_to_format(x, fmt, mode, subnormals=subnormals, overflow=overflow, rng=seed)
    assert_same_bits(got, want)


def test_stochastic_is_seeded_and_unbiased():
    """Mean of n stochastic roundings of x = 1 + f*ulp: E = x exactly for R-bit f.

    The sample mean's standard deviation is at most ulp/(2 sqrt(n)); we allow
    6 sigma (false-failure probability < 1e-8) for a fixed seed.
    """
    n = 200_000
    ulp = 2.0**-10
    for f in (0.25, 0.5, 0.75):
        x = np.full(n, 1.0 + f * ulp)
        a = round_to_format(x, FP16, "stochastic", rng=7)
        b = round_to_format(x, FP16, "stochastic", rng=7)
        assert_same_bits(a, b)
        assert set(np.unique(a)) <= {1.0, 1.0 + ulp}
        assert abs(a.mean() - x[0]) <= 6 * ulp / (2 * math.sqrt(n))


def test_fractions_below_two_to_the_minus_r_never_round_up_unless_rbits_says():
    """f = 2**-14 ulp (one bit finer than fp16's R = 13) rounds down every time; with
    rbits=14 it rounds up 1 time in 2**14, as the oracle does with the same draws; rbits
    past 51 - p (or below 1, or without stochastic rounding) is one clear error."""
    ulp = 2.0**-10
    x = np.full(1 << 20, 1.0 + 2.0**-14 * ulp)
    assert (round_to_format(x, FP16, "stochastic", rng=3) == 1.0).all()
    fine = round_to_format(x, FP16, "stochastic", rng=3, rbits=14)
    assert 32 <= (fine > 1.0).sum() <= 96  # 64 expected
    assert (fine[:8192] > 1.0).any()  # (the oracle draws the same integers: compare a slice with ups)
    assert_same_bits(fine[:8192], oracle.round_to_format(x[:8192], FP16, "stochastic", rng=3, rbits=14))
    round_to_format(x[:2], FP16, "stochastic", rng=3, rbits=32)
    for rbits, message in ((33, "rbits must be an integer from 1 to 32 for fp16; received 33"),
                           (0, "rbits must be an integer from 1 to 32 for fp16; received 0")):
        with pytest.raises(InvalidArgument, match=message):
            round_to_format(x[:2], FP16, "stochastic", rng=3, rbits=rbits)
    round_to_format(x[:2], FP32, "stochastic", rng=3, rbits=27)
    with pytest.raises(InvalidArgument, match="from 1 to 27 for fp32; received 28"):
        round_to_format(x[:2], FP32, "stochastic", rng=3, rbits=28)
    with pytest.raises(InvalidArgument, match="rbits needs rounding=stochastic; received rbits=14 with rounding=nearest_even"):
        round_to_format(x[:2], FP16, rbits=14)


def test_toward_zero_and_flush_and_saturate_examples():
    assert round_to_format(np.array([1 + 2**-10 - 2**-30]), FP16, "toward_zero")[0] == 1.0
    assert round_to_format(np.array([-65535.0]), FP16, "toward_zero")[0] == -65504.0
    assert round_to_format(np.array([2.0**-20]), FP16, subnormals="flush")[0] == 0.0
    assert math.copysign(1, round_to_format(np.array([-(2.0**-20)]), FP16, subnormals="flush")[0]) < 0
    assert round_to_format(np.array([1e9, -np.inf]), FP16, overflow="saturate").tolist() == [65504.0, -np.inf]
    assert np.isnan(round_to_format(np.array([1000.0]), FP8_E4M3)[0])


def test_bad_arguments_name_the_valid_choices():
    with pytest.raises(InvalidArgument, match="rounding must be one of nearest_even, toward_zero, stochastic; received 'up'"):
        round_to_format(np.ones(2), FP16, "up")
    with pytest.raises(InvalidArgument, match="fmt must be one of"):
        round_to_format(np.ones(2), "fp12")
    with pytest.raises(InvalidArgument, match="rng"):
        round_to_format(np.ones(2), FP16, "stochastic")
    with pytest.raises(InvalidArgument, match="overflow must be one of inf, saturate"):
        round_to_format(np.ones(2), FP16, overflow="wrap")


def test_format_registry_covers_ml_dtypes():
    for fmt in (f for f in FORMATS.values() if f.dtype_name):
        info = ml_dtypes.finfo(fmt.dtype) if fmt.bits < 32 and fmt.name != "fp16" else np.finfo(fmt.dtype)
        assert float(info.max) == fmt.max


def test_fp16_nearest_even_by_numpys_conversion_equals_the_rounding_kernel():
    """`round_to_format` to fp16, nearest even, subnormals kept, overflow to inf, takes NumPy's
    float64 -> float16 conversion: the same bits as the general kernel at every finite fp16
    value, every midpoint between neighbours and the float64 values either side of it (ties
    to even, and the sticky bit that breaks them), past 65504 (65520 is the tie to inf),
    below the smallest subnormal, at float32's values, and on a million values of spread
    exponents."""
    from convprobe.emulation.rounding import _kernel_rounding

    values = np.sort(np.unique(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
                               .astype(np.float64)))
    values = values[np.isfinite(values)]
    mids = (values[:-1] + values[1:]) / 2
    rng = np.random.default_rng(23)
    x = np.concatenate([values, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        mids.astype(np.float32).astype(np.float64),
                        [65519.99, 65520.0, 65520.0001, -65520.0, 1e300, -1e-300, 2.0**-25, 2.0**-25 + 2.0**-80,
                         2.0**-26, np.inf, -np.inf, np.nan, -0.0],
                        rng.standard_normal(10**6) * np.exp2(rng.integers(-40, 20, 10**6))])
    want = _kernel_rounding(x, FP16, "nearest_even", "keep", "inf", np.zeros(x.size, np.int64), 1)
    assert_same_bits(round_to_format(x, "fp16"), want)
    assert np.isinf(round_to_format(np.array([65520.0]), "fp16")).all()
    assert round_to_format(np.array([65519.99]), "fp16")[0] == 65504.0


@pytest.mark.tensorflow
def test_a_thread_that_treats_subnormals_as_zero_rounds_them_as_any_other():
    """TensorFlow runs a numpy_function in threads that treat float64 subnormals as zero (DAZ);
    the kernel told a zero by a float comparison there, and returned a subnormal unrounded
    (found by the oracle test above, after an emulated layer had run inside TensorFlow)."""
    import tensorflow as tf

    x = np.array([0.0, -0.0, 2.2250738585e-313, -4e-320, 1.0, -6e-8])
    want = oracle.round_to_format(x, FP16, "nearest_even", subnormals="keep", overflow="saturate")
    inside = tf.function(lambda t: tf.numpy_function(
        lambda _: round_to_format(x, FP16, "nearest_even", subnormals="keep", overflow="saturate"), [t],
        tf.float64), autograph=False)
    assert_same_bits(inside(tf.constant(0.0, tf.float64)).numpy(), want)
    assert_same_bits(round_to_format(x, FP16, "nearest_even", subnormals="keep", overflow="saturate"), want)
