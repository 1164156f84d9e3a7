"""Relative errors, comparisons, special counts and the summary, on values with exact answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from convprobe.analysis import (
    fraction_correctly_rounded,
    fraction_different,
    max_abs_diff,
    max_relative_error,
    median_relative_error,
    relative_error,
    relative_norm_error,
    special_counts,
    summarize,
)
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP8_E4M3, FP16

INF, NAN = math.inf, math.nan


def test_relative_error_exact_values_and_conventions():
    np.testing.assert_array_equal(
        relative_error([1.5, 3.0, -0.75, 0.0, 1.0, INF, INF, NAN, NAN, 2.0],
                       [1.0, 4.0, -1.0, 0.0, 0.0, INF, 1.0, NAN, 2.0, NAN]),
        [0.5, 0.25, 0.25, 0.0, INF, 0.0, INF, 0.0, INF, INF],
    )
    assert relative_error(np.float16(1.5), 1.0).dtype == np.float64


def test_max_and_median_relative_error():
    actual = [1.5, 3.0, 1.0, 8.0]
    reference = [1.0, 4.0, 1.0, 4.0]  # errors 0.5, 0.25, 0, 1
    assert max_relative_error(actual, reference) == 1.0
    assert median_relative_error(actual, reference) == 0.375
    assert max_relative_error([1.0, INF], [1.0, 2.0]) == INF


def test_relative_norm_error_exact_and_scaled():
    assert relative_norm_error([6.0, 8.0], [3.0, 4.0]) == 1.0  # ||(3,4)|| / ||(3,4)||
    assert relative_norm_error([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert relative_norm_error([0.0, 0.0], [0.0, 0.0]) == 0.0
    assert relative_norm_error([1.0, 0.0], [0.0, 0.0]) == INF
    # Squares of 3e200 overflow float64; the scaled norm does not.
    assert relative_norm_error([6e200, 8e200], [3e200, 4e200]) == 1.0
    assert relative_norm_error([6e-200, 8e-200], [3e-200, 4e-200]) == 1.0
    assert relative_norm_error([INF, 1.0], [2.0, 1.0]) == INF
    assert relative_norm_error([NAN, 6.0, 8.0], [NAN, 3.0, 4.0]) == 1.0


def test_fraction_correctly_rounded():
    reference = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65519.0, 65520.0, 1e-9, 1.1])
    rn = [1.0, 1 + 2**-9, 65504.0, INF, 0.0, float(np.float16(1.1))]
    assert fraction_correctly_rounded(rn, reference, FP16) == 1.0
    wrong = list(rn)
    wrong[0] = 1 + 2**-10  # the odd neighbour of the tie
    wrong[3] = 65504.0  # saturated instead of overflowing
    assert fraction_correctly_rounded(wrong, reference, FP16) == 4 / 6
    assert fraction_correctly_rounded([-0.0], [1e-30], FP16) == 1.0  # compared as values
    # e4m3 overflow is NaN, and NaN matches NaN.
    assert fraction_correctly_rounded([NAN, 448.0], [500.0, 460.0], FP8_E4M3) == 1.0
    # ml_dtypes would give 1.0 here (double rounding through float32).
    assert fraction_correctly_rounded([1 + 2**-7], [1 + 2**-8 + 2**-40], BF16) == 1.0


def test_max_abs_diff_and_fraction_different():
    assert max_abs_diff([1.0, 2.0, 3.0], [1.0, 2.5, 2.0]) == 1.0
    assert max_abs_diff([], []) == 0.0
    assert max_abs_diff([NAN], [NAN]) == 0.0
    assert max_abs_diff([INF], [1.0]) == INF
    assert fraction_different([0.0, 1.0, NAN, 2.0], [-0.0, 1.0, -NAN, 3.0]) == 0.5
    a16 = np.array([1.0, 0.1, 65504.0], dtype=np.float16)
    assert fraction_different(a16, a16.astype(np.float32)) == 0.0


def test_special_counts():
    actual = np.array([0.0, -0.0, INF, -INF, NAN, 1.0, 0.0], dtype=np.float16)
    reference = [0.0, 1e-9, 70000.0, INF, 1.0, 1.0, NAN]
    assert special_counts(actual) == {
        "size": 7, "inf": 2, "nan": 1, "zero": 3, "underflow": None, "overflow": None
    }
    assert special_counts(actual, reference) == {
        "size": 7, "inf": 2, "nan": 1, "zero": 3, "underflow": 1, "overflow": 1
    }


def test_summarize_the_65519_probe():
    # fp32 accumulation gives 0 for [65519]*4 x [65519, -65519]; an fp16 chain gives inf.
    reference = np.array([0.0, 2.0, 1 + 2**-11, 1e-9])
    actual = np.array([INF, 2.0, 1.0, 0.0], dtype=np.float16)
    s = summarize(actual, reference, "fp16")
    assert s == {
        "format": "fp16",
        "n": 4,
        "max_abs_diff": INF,
        "max_relative_error": INF,
        "median_relative_error": (2**-11 / (1 + 2**-11) + 1) / 2,  # of {0, 2**-11/(1+2**-11), 1, inf}
        "relative_norm_error": INF,
        "max_ulp_error": INF,
        "median_ulp_error": (0.5 + 1e-9 / 2**-24) / 2,
        "max_ulp_distance": 0x7C00,  # from 0 to inf: the encoding of inf
        "fraction_correctly_rounded": 0.75,
        "fraction_different": 0.25,
        "max_abs_sum_error": None,
        "inf_count": 1,
        "nan_count": 0,
        "zero_count": 1,
        "underflow_count": 1,
        "overflow_count": 1,
    }
    json.dumps(s)  # plain Python values
    assert all(type(v) in (str, int, float, type(None)) for v in s.values())
    with_sum = summarize(actual[1:], reference[1:], "fp16", abs_sum=[4.0, 2.0**-11, 1.0])
    assert with_sum["max_abs_sum_error"] == 1.0  # 2**-11 off on a sum|x w| of 2**-11


def test_summarize_clean_result_is_strict_json():
    rng = np.random.default_rng(5)
    reference = rng.standard_normal(1000)
    actual = reference.astype(np.float16)
    s = summarize(actual, reference, FP16)
    json.dumps(s, allow_nan=False)
    assert s["fraction_correctly_rounded"] == 1.0 and s["max_ulp_distance"] == 0
    assert s["max_ulp_error"] <= 0.5


def test_bad_inputs_name_the_argument():
    with pytest.raises(InvalidArgument, match="actual must be non-empty"):
        max_relative_error([], [])
    with pytest.raises(InvalidArgument, match="reference must hold real floating-point numbers; received dtype <U1"):
        relative_error([1.0], ["a"])
    with pytest.raises(InvalidArgument, match="fmt must be one of"):
        summarize([1.0], [1.0], "int8")
    with pytest.raises(InvalidArgument, match=r"actual and reference must have broadcastable shapes"):
        summarize([1.0, 2.0], [1.0, 2.0, 3.0], FP16)
    with pytest.raises(InvalidArgument, match=r"actual holds 1 value\(s\) not representable in fp16"):
        summarize([0.1], [0.1], FP16)


def test_abs_sum_error_stays_meaningful_under_cancellation():
    from convprobe.analysis import abs_sum_error, max_abs_sum_error

    # x = (1, -1 + 2**-10), y = (1, 1): s = 2**-10, sum|x y| = 2 - 2**-10.
    reference, abs_sum = 2.0**-10, 2.0 - 2.0**-10
    assert relative_error(0.0, reference) == 1.0
    assert abs_sum_error(0.0, reference, abs_sum) == 2.0**-10 / (2.0 - 2.0**-10)
    np.testing.assert_array_equal(abs_sum_error([0.0, 1.0], [0.0, 0.0], [0.0, 0.0]), [0.0, INF])
    assert max_abs_sum_error([1.0, 3.0], [1.0, 2.0], [4.0, 4.0]) == 0.25
    with pytest.raises(InvalidArgument, match="abs_sum must be non-negative"):
        abs_sum_error([1.0], [1.0], [-1.0])
