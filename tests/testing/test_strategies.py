"""Hypothesis strategies: values are representable, ranges exact, adversarial cases really adversarial."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convprobe.emulation import dot, parse_model
from convprobe.errors import InvalidArgument
from convprobe.formats import parse_format
from convprobe.testing.strategies import (
    ADVERSARIAL_KINDS,
    adversarial_dots,
    bf16_arrays,
    boundary_values,
    fp16_arrays,
    representable_arrays,
    representable_floats,
)

FORMATS = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp32")
FEW = settings(max_examples=40, deadline=None)


def _representable(values: np.ndarray, fmt: str) -> bool:
    f = parse_format(fmt)
    wide = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        return bool(np.array_equal(wide.astype(f.dtype).astype(np.float64), wide, equal_nan=True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_arrays_hold_values_of_the_format_in_its_dtype(fmt):
    f = parse_format(fmt)

    @FEW
    @given(representable_arrays(fmt, (3, 5)))
    def check(a):
        assert a.dtype == f.dtype and a.shape == (3, 5)
        assert np.all(np.isfinite(a.astype(np.float64)))
        assert np.all(np.abs(a.astype(np.float64)) <= f.max)

    check()


@FEW
@given(fp16_arrays(64, min_value=0.5, max_value=2.0))
def test_ranges_are_exact(a):
    wide = a.astype(np.float64)
    assert wide.min() >= 0.5 and wide.max() <= 2.0


def test_every_code_point_of_a_range_is_reachable():
    # [1, 1 + 4 ulp] in fp16 has exactly five values; the encodings draw each of them.
    seen = set()

    @settings(max_examples=200, deadline=None)
    @given(representable_floats("fp16", min_value=1.0, max_value=1.0 + 4 * 2.0**-10))
    def collect(v):
        seen.add(v)

    collect()
    assert seen == {1.0 + i * 2.0**-10 for i in range(5)}


@FEW
@given(bf16_arrays(16, allow_subnormal=False))
def test_subnormals_can_be_excluded(a):
    wide = np.abs(a.astype(np.float64))
    assert np.all((wide == 0) | (wide >= parse_format("bf16").tiny))


@FEW
@given(representable_floats("fp16", allow_infinity=True, allow_nan=True))
def test_scalars_may_include_inf_and_nan(v):
    assert _representable(np.array([v]), "fp16")


def test_boundary_values_are_the_documented_fp16_edges_and_ties():
    seen = set()

    @settings(max_examples=300, deadline=None)
    @given(boundary_values("fp16"))
    def collect(b):
        seen.add(b)

    collect()
    sub = 2.0**-24
    edges = {0.0, sub, 2 * sub, 2.0**-14 - sub, 2.0**-14, 2.0**-14 + sub, 1.0, 1.0 + 2.0**-10, 1.0 - 2.0**-11, 65504.0, 65472.0}
    ties = {sub / 2, 1.5 * sub, 2.0**-14 - sub / 2, 1.0 - 2.0**-12, 1.0 + 2.0**-11, 65520.0}
    assert {abs(b) for b in seen} <= edges | ties
    assert len(seen) >= 20  # both signs of most of the 17 magnitudes
    assert all(_representable(np.array([b]), "fp16") for b in edges)
    assert not any(_representable(np.array([b]), "fp16") for b in ties)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ADVERSARIAL_KINDS)
def test_adversarial_cases_are_representable_with_an_exact_value(fmt, kind):
    @settings(max_examples=15, deadline=None)
    @given(adversarial_dots(fmt, kind=kind, max_k=32))
    def check(case):
        assert case.kind == kind and case.a.shape == case.b.shape and 1 <= case.K <= 32 + 2
        assert _representable(case.a, fmt) and _representable(case.b, fmt)
        assert case.exact == math.fsum(float(x) * float(y) for x, y in zip(case.a.astype(float), case.b.astype(float)))
        x, w = case.as_conv()
        assert x.shape == (1, 1, 1, case.K) and w.shape == (1, 1, case.K, 1)

    check()


@pytest.mark.parametrize("kind", ADVERSARIAL_KINDS)
def test_adversarial_cases_break_an_fp16_accumulator_but_not_an_exact_one(kind):
    """Each kind makes sequential fp16 accumulation wrong at least sometimes; exact accumulation never is."""
    wrong = []

    @settings(max_examples=25, deadline=None, derandomize=True)
    @given(adversarial_dots("fp16", kind=kind, max_k=32))
    def check(case):
        with np.errstate(over="ignore", invalid="ignore"):
            fp16 = float(dot(case.a, case.b, parse_model("sequential:fp16")))
        exact = float(dot(case.a, case.b, parse_model("exact:fp64")))
        assert exact == case.exact
        wrong.append(fp16 != float(np.float16(case.exact)))

    check()
    assert any(wrong), f"no {kind} case changed an fp16 accumulator's result"


def test_strategies_reject_bad_arguments():
    with pytest.raises(InvalidArgument, match="kind must be one of cancellation, swamping, overflow, subnormal; received 'chaos'"):
        adversarial_dots("fp16", kind="chaos")
    with pytest.raises(InvalidArgument, match="max_k must be an integer >= 4"):
        adversarial_dots("fp16", max_k=2)
    with pytest.raises(InvalidArgument, match="no fp16 value lies in"):
        representable_floats("fp16", min_value=1.0 + 2.0**-12, max_value=1.0 + 2.0**-11)
    with pytest.raises(InvalidArgument, match="format must be one of"):
        representable_floats("fp12")
    assert isinstance(st.none(), st.SearchStrategy)
