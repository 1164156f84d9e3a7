"""Error bounds: exact values where the arithmetic is exact, and that each bound bounds.

The "it bounds" tests accumulate seeded fp16 data with one correct rounding per
step (`round_nearest_even`), so they check the formulas against the model they
claim to cover, not against any particular backend.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from convprobe.analysis import (
    DEFAULT_LAMBDA,
    blocked_fma_bound,
    dot_error_bound,
    dot_probabilistic_confidence,
    gamma,
    probabilistic_bound,
    probabilistic_confidence,
    round_nearest_even,
)
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP16, FP32

U16 = FP16.unit_roundoff


def test_gamma_exact_values():
    assert gamma(1, 0.5) == 1.0
    assert gamma(3, 0.25) == 3.0
    for k in (1, 4, 9, 100, 2047):
        exact = Fraction(k) * Fraction(1, 2048) / (1 - Fraction(k) * Fraction(1, 2048))
        assert gamma(k, U16) == float(exact)  # k*u and 1 - k*u are exact: one rounding
    np.testing.assert_array_equal(gamma(np.array([1, 3]), 0.25), [1 / 3, 3.0])
    assert isinstance(gamma(2, U16), float)


def test_gamma_refuses_k_u_of_one_or_more():
    with pytest.raises(InvalidArgument, match=r"gamma_k needs k\*u < 1; received k=2048, u=0.00048828125 \(k\*u=1\)"):
        gamma(2048, U16)
    with pytest.raises(InvalidArgument, match="k=4096"):
        gamma([16, 4096, 8192], U16)
    with pytest.raises(InvalidArgument, match="k must be a positive integer"):
        gamma(0, U16)
    with pytest.raises(InvalidArgument, match="k must be a positive integer"):
        gamma(2.5, U16)
    with pytest.raises(InvalidArgument, match=r"u must be a unit roundoff in \(0, 1\); received 1.5"):
        gamma(2, 1.5)


def test_probabilistic_bound_exact_values_and_second_order_form():
    assert probabilistic_bound(1024, U16, lam=2.0) == 2.0**-5  # 2 * 32 * 2**-11
    assert probabilistic_bound(16, 2.0**-24) == DEFAULT_LAMBDA * 4 * 2.0**-24
    ks = np.array([16, 256, 4096, 16384])
    first = probabilistic_bound(ks, U16)
    full = probabilistic_bound(ks, U16, first_order=False)
    expected = np.expm1(DEFAULT_LAMBDA * np.sqrt(ks) * U16 + ks * U16**2 / (1 - U16))
    np.testing.assert_array_equal(full, expected)
    assert np.all(full > first)
    with pytest.raises(InvalidArgument, match="lam must be a positive number; received 0"):
        probabilistic_bound(4, U16, lam=0)


def test_probabilistic_confidence():
    assert probabilistic_confidence(1.0, U16) == 0.0  # 1 - 2 exp(-1/2) < 0: clipped
    lam, u = 3.0, U16
    assert probabilistic_confidence(lam, u) == 1.0 - 2.0 * math.exp(-(lam**2) * (1 - u) ** 2 / 2)
    assert 0.977 < probabilistic_confidence(3.0, u) < 0.978  # the value quoted in the docstring
    p5 = probabilistic_confidence(5.0, u)
    assert dot_probabilistic_confidence(100, 5.0, u) == 1.0 - 100 * (1.0 - p5)
    assert dot_probabilistic_confidence(16384, 3.0, u) == 0.0


def test_blocked_fma_bound_reduces_to_gamma_and_counts_blocks():
    for k in (1, 7, 64, 1000):
        assert blocked_fma_bound(k, U16, 1) == gamma(k, U16)  # scalar FMA chain
    # q = ceil(k/b) output roundings: k = 4096, b = 32 -> gamma_128.
    assert blocked_fma_bound(4096, U16, 32) == gamma(128, U16)
    assert blocked_fma_bound(4097, U16, 32) == gamma(129, U16)
    # fp32 internal additions add gamma_{bq}(u32); fp32 inputs rounded to fp16 add (1+u16)^2.
    got = blocked_fma_bound(64, U16, 4, u_internal=2.0**-24, u_input=U16)
    exact = (1 + Fraction(U16)) ** 2 * (1 + Fraction(gamma(64, 2.0**-24))) * (1 + Fraction(gamma(16, U16))) - 1
    # The expanded sum of 6 terms costs at most 10 roundings of 2**-53 (first order).
    assert abs(Fraction(got) - exact) <= 10 * Fraction(2) ** -53 * exact
    # Valid where gamma_k(fp16) is not: k = 16384 with b = 32 needs only k/b = 512 < 2048.
    assert blocked_fma_bound(16384, U16, 32) == gamma(512, U16)
    with pytest.raises(InvalidArgument, match="block_size must be a positive integer; received 0"):
        blocked_fma_bound(16, U16, 0)
    with pytest.raises(InvalidArgument, match=r"u_internal must be in \[0, 1\)"):
        blocked_fma_bound(16, U16, 4, u_internal=-1.0)


def test_dot_error_bound_kinds_and_output_rounding():
    assert dot_error_bound(100, "fp16") == gamma(100, U16)
    assert dot_error_bound(100, FP16, "probabilistic", lam=2.0) == probabilistic_bound(100, U16, 2.0)
    assert dot_error_bound(100, "bf16", "blocked", block_size=4) == blocked_fma_bound(100, BF16.unit_roundoff, 4)
    assert dot_error_bound(64, "fp16", "blocked", block_size=4, internal="fp32") == blocked_fma_bound(
        64, U16, 4, u_internal=2.0**-24
    )
    g32 = gamma(1000, FP32.unit_roundoff)
    assert dot_error_bound(1000, "fp32", output="fp16") == U16 + (1 + U16) * g32
    np.testing.assert_array_equal(
        dot_error_bound(np.array([4, 16]), "fp16", "probabilistic", lam=1.0), [2 * U16, 4 * U16]
    )
    with pytest.raises(InvalidArgument, match="kind must be one of deterministic, probabilistic, blocked; received 'worst'"):
        dot_error_bound(4, "fp16", "worst")
    with pytest.raises(InvalidArgument, match="block_size is required when kind is 'blocked'"):
        dot_error_bound(4, "fp16", "blocked")
    with pytest.raises(InvalidArgument, match="fmt must be one of"):
        dot_error_bound(4, "fp17")


def _data(k: int, trials: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """fp16 x, y in [0.5, 1): products and block sums are exact in float64."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.0, (trials, k)).astype(np.float16).astype(np.float64)
    y = rng.uniform(0.5, 1.0, (trials, k)).astype(np.float16).astype(np.float64)
    return x, y


@pytest.mark.parametrize("k", [16, 300, 2000])
def test_gamma_bounds_sequential_fp16_fma_chains(k):
    x, y = _data(k, 64, seed=k)
    s = np.zeros(x.shape[0])
    for i in range(k):  # s <- RN16(s + x_i y_i): an fp16 FMA chain, one rounding per step
        s = round_nearest_even(s + x[:, i] * y[:, i], FP16)
    exact = np.sum(x * y, axis=1)
    abs_sum = np.sum(np.abs(x * y), axis=1)
    err = np.abs(s - exact) / abs_sum
    assert np.all(err <= dot_error_bound(k, FP16))
    assert np.all(err <= blocked_fma_bound(k, U16, 1))


@pytest.mark.parametrize(("k", "b"), [(64, 4), (1024, 8), (8192, 32)])
def test_blocked_bound_bounds_blocked_fp16_accumulation(k, b):
    x, y = _data(k, 32, seed=k + b)
    products = (x * y).reshape(x.shape[0], -1, b)
    blocks = products.sum(axis=2)  # exact: b products of 22 bits in 53
    s = np.zeros(x.shape[0])
    for j in range(blocks.shape[1]):
        s = round_nearest_even(s + blocks[:, j], FP16)
    exact = np.sum(x * y, axis=1)
    err = np.abs(s - exact) / np.sum(x * y, axis=1)
    assert np.all(err <= blocked_fma_bound(k, U16, b))
    assert np.all(err <= dot_error_bound(k, FP16, "blocked", block_size=b))
