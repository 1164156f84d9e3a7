"""The fast twins of the one rounding routine, `round_f64`: `fast_round` (any value of a
format away from float64's underflow) and `round_normal` (results known to be normal),
bit for bit on every fp16 code point and the values around it, and on random float64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from convprobe.emulation._kernel_arithmetic import NEAREST_EVEN, TOWARD_ZERO, round_f64
from convprobe.emulation._kernels_fast import fast_round, round_limits, round_normal
from convprobe.formats import BF16, FP16, FP32

from .conftest import assert_same_bits

MODES = [NEAREST_EVEN, TOWARD_ZERO]


@njit(cache=True)
def _all_three(x, p, emin, maxv, mode, ref, fast, normal):
    lim = round_limits(p, emin, maxv, True, True)
    for i in range(x.shape[0]):
        ref[i] = round_f64(x[i], p, emin, maxv, True, True, mode, False, 0, 1)
        fast[i] = fast_round(x[i], lim[0], lim[1], lim[2], lim[3], lim[4], lim[5], mode, False, 0, 1)
        normal[i] = round_normal(x[i], p, mode)


def _round_all(x, fmt, mode):
    ref, fast, normal = (np.empty_like(x) for _ in range(3))
    _all_three(x, fmt.precision, fmt.emin, float(fmt.max), mode, ref, fast, normal)
    return ref, fast, normal


def _around_fp16_code_points():
    """Every finite fp16 value and its neighbours a quarter, a half and three quarters of an
    fp16 ulp away: exact float64 values that are ties or lie just above or below them for
    a format of 11 bits, and values between code points for narrower ones."""
    v = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    v = v[np.isfinite(v)]
    _, e = np.frexp(v)
    ulp = np.ldexp(1.0, np.maximum(np.where(v == 0, FP16.emin, e - 1), FP16.emin) - (FP16.precision - 1))
    steps = np.array([0.0, 0.25, 0.5, 0.75, -0.25, -0.5])
    return (v[:, None] + steps[None, :] * ulp[:, None]).ravel()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [FP16, BF16])
def test_twins_equal_round_f64_on_every_fp16_code_point(fmt, mode):
    x = _around_fp16_code_points()
    ref, fast, normal = _round_all(x, fmt, mode)
    assert_same_bits(fast, ref)
    normal_range = (np.abs(x) >= fmt.tiny) & (np.abs(ref) <= fmt.max)
    assert normal_range.sum() > 50_000
    assert_same_bits(normal[normal_range], ref[normal_range])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False), min_size=1, max_size=50),
       st.sampled_from(MODES), st.sampled_from([FP32, BF16, FP16]))
def test_twins_equal_round_f64_on_random_float64(values, mode, fmt):
    """Random float64 values are exact inputs at 53 bits (>= p + 2 for every format here)."""
    x = np.array(values)
    ref, fast, normal = _round_all(x, fmt, mode)
    assert_same_bits(fast, ref)
    ok = (np.abs(x) >= fmt.tiny) & (np.abs(ref) <= fmt.max)
    assert_same_bits(normal[ok], ref[ok])


def test_round_normal_truncates_and_ties_to_even():
    one = 1.0 + 2.0**-11  # a tie for fp16: nearest even keeps 1, truncation too
    _, _, normal = _round_all(np.array([one, 1.0 + 3 * 2.0**-11, -(1.0 + 3 * 2.0**-11)]), FP16, NEAREST_EVEN)
    assert normal.tolist() == [1.0, 1.0 + 2.0**-9, -(1.0 + 2.0**-9)]
    _, _, normal = _round_all(np.array([1.0 + 3 * 2.0**-11, 2.0 - 2.0**-12]), FP16, TOWARD_ZERO)
    assert normal.tolist() == [1.0 + 2.0**-10, 2.0 - 2.0**-10]
