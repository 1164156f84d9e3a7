"""ULPs: distance, ulp(x), ulp error and round-to-nearest-even, against independent oracles.

Oracles never look at bit patterns: a value's rank is its index among the
sorted distinct values of the format (fp8/bf16/fp16, every encoding), or is
computed arithmetically from frexp in Python integers (fp32/fp64 samples).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from analysis_helpers import EXHAUSTIVE, all_values, ids, widen

from convprobe.analysis import (
    ULP_DISTANCE_MAX,
    round_nearest_even,
    ulp,
    ulp_distance,
    ulp_error,
)
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FP64, Format


def _sorted_distinct(fmt: Format) -> np.ndarray:
    """All non-NaN values of `fmt`, ascending, with -0 and +0 merged (np.unique compares values)."""
    v = widen(all_values(fmt))
    return np.unique(v[~np.isnan(v)])


def _rank(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of each value among the sorted distinct values, centred on zero."""
    zero = np.searchsorted(table, 0.0)
    return np.searchsorted(table, values).astype(np.int64) - zero


def _rank_arithmetic(x: float, fmt: Format) -> int:
    """Signed rank of a representable value, from frexp in exact Python integers."""
    if math.isinf(x):
        return int(math.copysign(_rank_arithmetic(fmt.max, fmt) + 1, x))
    ax = abs(x)
    if ax < fmt.tiny:
        r = int(math.ldexp(ax, -(fmt.emin - fmt.precision + 1)))  # multiple of the subnormal step
    else:
        m, e = math.frexp(ax)  # ax = m * 2**e, m in [0.5, 1)
        significand = int(math.ldexp(m, fmt.precision))  # in [2**(p-1), 2**p)
        r = (e - 1 - fmt.emin) * 2 ** (fmt.precision - 1) + significand
    return -r if math.copysign(1.0, x) < 0 else r


# --------------------------------------------------------------------------- ulp_distance


@pytest.mark.parametrize("fmt", EXHAUSTIVE, ids=ids)
def test_ulp_distance_every_code_point_against_rank_oracle(fmt):
    values = all_values(fmt)
    wide = widen(values)
    table = _sorted_distinct(fmt)
    finite_or_inf = ~np.isnan(wide)
    v = values[finite_or_inf]
    rank = _rank(wide[finite_or_inf], table)
    if v.size <= 256:  # fp8: every ordered pair
        got = ulp_distance(v[:, None], v[None, :], fmt)
        np.testing.assert_array_equal(got, np.abs(rank[:, None] - rank[None, :]))
        return
    anchors = np.array(
        [0.0, -0.0, fmt.smallest_subnormal, -fmt.smallest_subnormal, fmt.tiny, -fmt.tiny,
         fmt.tiny - fmt.smallest_subnormal, 1.0, -1.0, 2.0, fmt.max, -fmt.max, np.inf, -np.inf]
    )
    rng = np.random.default_rng(20261129)
    anchors = np.concatenate([anchors, rng.choice(wide[finite_or_inf], 10)])
    anchor_rank = _rank(anchors, table)
    for a, ra in zip(anchors, anchor_rank):
        np.testing.assert_array_equal(ulp_distance(v, a, fmt), np.abs(rank - ra), err_msg=f"anchor {a}")
    i, j = rng.integers(0, v.size, size=(2, 200_000))
    np.testing.assert_array_equal(ulp_distance(v[i], v[j], fmt), np.abs(rank[i] - rank[j]))


@pytest.mark.parametrize("fmt", EXHAUSTIVE, ids=ids)
def test_ulp_distance_arithmetic_oracle_agrees_on_every_code_point(fmt):
    wide = widen(all_values(fmt))
    v = wide[~np.isnan(wide)]
    expected = np.array([_rank_arithmetic(float(x), fmt) for x in v])
    table_rank = _rank(v, _sorted_distinct(fmt))
    np.testing.assert_array_equal(expected, table_rank)  # the two oracles agree
    np.testing.assert_array_equal(ulp_distance(v, 0.0, fmt), np.abs(expected))


def test_ulp_distance_fp16_nextafter_is_one_step_everywhere():
    v = all_values(FP16)
    v = v[~np.isnan(v) & (v != np.float16(np.inf))]
    with np.errstate(over="ignore"):  # nextafter(max, inf) is inf, on purpose
        up = np.nextafter(v, np.float16(np.inf))
    np.testing.assert_array_equal(ulp_distance(v, up, FP16), 1)
    np.testing.assert_array_equal(ulp_distance(up, v, FP16), 1)


@pytest.mark.parametrize("fmt", [FP32, FP64], ids=ids)
def test_ulp_distance_wide_formats_on_seeded_sample_and_edges(fmt):
    rng = np.random.default_rng(7)
    dt = fmt.dtype
    uint = np.uint32 if dt.itemsize == 4 else np.uint64
    codes = rng.integers(0, np.iinfo(uint).max, size=3000, dtype=uint, endpoint=True)
    sample = widen(codes.view(dt))
    edges = [0.0, -0.0, fmt.smallest_subnormal, -fmt.smallest_subnormal, fmt.tiny, -fmt.tiny,
             fmt.tiny - fmt.smallest_subnormal, 1.0, -1.0, 0.5, 2.0, 1024.0, fmt.max, -fmt.max,
             np.inf, -np.inf]
    values = np.concatenate([np.array(edges), sample[~np.isnan(sample)]])
    ranks = [_rank_arithmetic(float(x), fmt) for x in values]
    a, b = values[:1500], values[1500:3000]
    expected = [abs(x - y) for x, y in zip(ranks[:1500], ranks[1500:3000])]
    expected = np.array([min(e, ULP_DISTANCE_MAX) for e in expected], dtype=np.int64)
    np.testing.assert_array_equal(ulp_distance(a, b, fmt), expected)
    np.testing.assert_array_equal(ulp_distance(values[:16], 0.0, fmt), [abs(r) for r in ranks[:16]])
    # k steps of nextafter are k ulps, across the power of two at 1 and the normal boundary.
    for start in (1.0 - 3 * fmt.epsilon / 2, fmt.tiny - 2 * fmt.smallest_subnormal, -1.0):
        x = np.asarray(start, dtype=dt)
        steps = [x]
        for _ in range(6):
            steps.append(np.nextafter(steps[-1], np.asarray(np.inf, dtype=dt)))
        np.testing.assert_array_equal(ulp_distance(x, np.array(steps), fmt), np.arange(7))


def test_ulp_distance_signed_zero_infinity_and_nan():
    assert ulp_distance(0.0, -0.0, FP16) == 0
    assert ulp_distance(-FP16.smallest_subnormal, FP16.smallest_subnormal, FP16) == 2
    assert ulp_distance(FP16.max, np.inf, FP16) == 1
    assert ulp_distance(-np.inf, np.inf, FP16) == 2 * (2**15 - 2**10)  # 2 * 0x7C00
    assert ulp_distance(np.nan, np.nan, BF16) == 0
    assert ulp_distance(np.nan, 1.0, FP8_E5M2) == ULP_DISTANCE_MAX
    assert ulp_distance(np.inf, np.nan, FP16) == ULP_DISTANCE_MAX
    # fp64 distances past int64 saturate: -max to +max is 2 * 0x7FEFFFFFFFFFFFFF steps.
    assert ulp_distance(-FP64.max, FP64.max, FP64) == ULP_DISTANCE_MAX
    assert ulp_distance(FP64.max, FP64.max, FP64) == 0
    # e4m3 has no infinity: 448 is its largest value, and inf is not representable.
    with pytest.raises(InvalidArgument, match="not representable in fp8_e4m3"):
        ulp_distance(np.inf, 448.0, FP8_E4M3)


def test_ulp_distance_accepts_storage_dtypes_and_broadcasts():
    a = np.array([1, 2, 4], dtype=np.float16)
    b = np.array([[1.0], [2.0]])
    d = ulp_distance(a, b, "float16")
    assert d.dtype == np.int64 and d.shape == (2, 3)
    np.testing.assert_array_equal(d, [[0, 1024, 2048], [1024, 0, 1024]])


def test_ulp_distance_rejects_unrepresentable_bad_dtypes_and_shapes():
    with pytest.raises(InvalidArgument, match=r"a holds 1 value\(s\) not representable in fp16, e.g. 0.1"):
        ulp_distance([0.1, 0.5], 0.5, FP16)
    with pytest.raises(InvalidArgument, match="fmt must be one of fp8_e4m3, fp8_e5m2, bf16, fp16, tf32, fp32, fp64; received 'fp12'"):
        ulp_distance(1.0, 1.0, "fp12")
    with pytest.raises(InvalidArgument, match="b must hold real floating-point numbers; received dtype complex128"):
        ulp_distance(1.0, [1j], FP16)
    with pytest.raises(InvalidArgument, match=r"a and b must have broadcastable shapes; received \(2,\) and \(3,\)"):
        ulp_distance([1.0, 2.0], [1.0, 2.0, 4.0], FP16)


# --------------------------------------------------------------------------- ulp(x)


def _gap_above(fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative finite values and the gap to the next value (below, at max)."""
    table = _sorted_distinct(fmt)
    pos = table[(table >= 0) & np.isfinite(table)]
    gap = np.empty_like(pos)
    gap[:-1] = np.diff(pos)
    gap[-1] = pos[-1] - pos[-2]
    return pos, gap


@pytest.mark.parametrize("fmt", EXHAUSTIVE, ids=ids)
def test_ulp_is_the_gap_above_on_every_value(fmt):
    pos, gap = _gap_above(fmt)
    np.testing.assert_array_equal(ulp(pos, fmt), gap)
    np.testing.assert_array_equal(ulp(-pos, fmt), gap)


def test_ulp_round_values_and_specials():
    np.testing.assert_array_equal(
        ulp([1.0, 1.5, 2.0, 2.0 - 2**-10, 2**-14, 2**-15, 0.0, 65504.0, 1e6], FP16),
        [2**-10, 2**-10, 2**-9, 2**-10, 2**-24, 2**-24, 2**-24, 32.0, 2.0**9],
    )
    np.testing.assert_array_equal(ulp([1.0, 2**-126, 0.0], FP32), [2**-23, 2**-149, 2**-149])
    np.testing.assert_array_equal(ulp([1.0, 0.0], FP64), [2**-52, 2**-1074])
    np.testing.assert_array_equal(ulp([np.inf, -np.inf], BF16), [np.inf, np.inf])
    assert np.isnan(ulp(np.nan, BF16))


# --------------------------------------------------------------------------- rounding


@pytest.mark.parametrize("fmt", EXHAUSTIVE, ids=ids)
def test_round_nearest_even_between_every_pair_of_neighbours(fmt):
    table = _sorted_distinct(fmt)
    table = table[np.isfinite(table)]
    lo, hi = table[:-1], table[1:]
    gap = hi - lo
    mid = lo + gap / 2
    uint = np.uint8 if fmt.dtype.itemsize == 1 else np.uint16
    lo_odd = (lo.astype(fmt.dtype).view(uint) & 1).astype(bool)  # last significand bit
    even = np.where(lo_odd, hi, lo)
    cases = {
        "quarter": (lo + gap / 4, lo),
        "three quarters": (lo + 3 * gap / 4, hi),
        "just below mid": (np.nextafter(mid, -np.inf), lo),
        "just above mid": (np.nextafter(mid, np.inf), hi),
        "tie": (mid, even),
        "exact": (lo, lo),
    }
    for name, (x, expected) in cases.items():
        got = round_nearest_even(x, fmt)
        np.testing.assert_array_equal(got, expected, err_msg=f"{fmt.name}: {name}")


def test_round_nearest_even_matches_numpy_fp16_cast_on_seeded_sample():
    # NumPy's float64 -> float16 cast is correctly rounded (one rounding).
    rng = np.random.default_rng(3)
    x = np.ldexp(rng.uniform(-2, 2, 100_000), rng.integers(-30, 18, 100_000))
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(round_nearest_even(x, FP16), expected)


def test_round_nearest_even_overflow_and_specials():
    np.testing.assert_array_equal(
        round_nearest_even([65519.99, 65520.0, -65520.0, 1e300], FP16), [65504.0, np.inf, -np.inf, np.inf]
    )
    # e4m3: 464 is the tie between 448 (even) and 480 (not a value): stays 448; beyond is NaN.
    got = round_nearest_even([464.0, 464.5, -1e6, np.inf], FP8_E4M3)
    assert got[0] == 448.0 and np.isnan(got[1:]).all()
    np.testing.assert_array_equal(round_nearest_even([61439.0, 61440.0], FP8_E5M2), [57344.0, np.inf])
    # ml_dtypes rounds float64 -> bf16 via float32; we do not: 1 + 2**-8 + 2**-40 is above the tie.
    assert round_nearest_even(1 + 2**-8 + 2**-40, BF16) == 1 + 2**-7
    r = round_nearest_even([-1e-30, 1e-30, np.nan], FP16)
    assert math.copysign(1, r[0]) == -1 and r[1] == 0 and math.copysign(1, r[1]) == 1 and np.isnan(r[2])
    x = np.array([1 + 2**-60, -3.0, np.inf])
    np.testing.assert_array_equal(round_nearest_even(x, FP64), x)


# --------------------------------------------------------------------------- ulp_error


@pytest.mark.parametrize("fmt", EXHAUSTIVE, ids=ids)
def test_ulp_error_is_exact_at_quarter_points_of_every_gap(fmt):
    table = _sorted_distinct(fmt)
    table = table[np.isfinite(table)]
    pos = table[table >= 0]
    lo, hi = pos[:-1], pos[1:]
    gap = hi - lo
    for frac in (0.0, 0.25, 0.5, 0.75):
        ref = lo + frac * gap
        for sign in (1.0, -1.0):  # ulp(-x) = ulp(x): mirror the pair, not the gap below
            np.testing.assert_array_equal(ulp_error(sign * lo, sign * ref, fmt), frac)
            np.testing.assert_array_equal(ulp_error(sign * hi, sign * ref, fmt), 1.0 - frac)
    np.testing.assert_array_equal(ulp_error(table, table, fmt), 0.0)


@pytest.mark.parametrize("fmt", [*EXHAUSTIVE, FP32], ids=ids)
def test_correctly_rounded_results_are_within_half_an_ulp(fmt):
    rng = np.random.default_rng(11)
    top = fmt.emax + 1 if fmt.has_inf else fmt.emax
    ref = np.ldexp(rng.uniform(-1, 1, 50_000), rng.integers(fmt.emin - fmt.precision, top, 50_000))
    rn = round_nearest_even(ref, fmt)
    finite = np.isfinite(rn)
    assert finite.mean() > 0.9
    assert ulp_error(rn[finite], ref[finite], fmt).max() <= 0.5


def test_ulp_error_nonfinite_conventions():
    np.testing.assert_array_equal(
        ulp_error([np.inf, np.inf, -np.inf, np.nan, np.nan, 1.0], [np.inf, 1.0, np.inf, np.nan, 1.0, np.nan], FP16),
        [0.0, np.inf, np.inf, 0.0, np.inf, np.inf],
    )
    assert ulp_error(0.0, 0.0, FP16) == 0.0
    assert ulp_error(2**-24, 0.0, FP16) == 1.0  # ulp(0) is the smallest subnormal
    assert ulp_error(65504.0, 65536.0, FP16) == 0.5  # past max, ulp keeps growing: ulp(2**16) = 64


# --------------------------------------------------------------------------- properties

_f32 = st.floats(width=32, allow_nan=False)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.lists(_f32, min_size=3, max_size=3))
def test_ulp_distance_is_a_metric_on_a_line(values):
    a, b, c = sorted(values)
    ab, bc, ac = ulp_distance([a, b, a], [b, c, c], FP32)
    assert ac == ab + bc  # ranks are a linear order: distances add along it
    assert ulp_distance(b, a, FP32) == ab
    assert (ab == 0) == (a == b)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.floats(min_value=-6e4, max_value=6e4, allow_nan=False), st.sampled_from([*EXHAUSTIVE, FP32]))
def test_rounding_is_within_half_an_ulp_and_idempotent(x, fmt):
    r = round_nearest_even(x, fmt)
    if np.isfinite(r):
        assert ulp_error(r, x, fmt) <= 0.5
        assert round_nearest_even(r, fmt) == r
