"""Shared helpers for the emulation tests: bit-exact comparison, the CPU kernels' skips,
hypothesis case budgets."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convprobe.emulation import _native_fp16
from convprobe.emulation.tree import Chain, Fused, parse_tree

needs_fp16_fma = pytest.mark.skipif(not _native_fp16.available(),
                                    reason="no AVX512-FP16 kernel (CPU lacks it or CONVPROBE_NATIVE_FP16=0)")
needs_f16c = pytest.mark.skipif(not _native_fp16.available(fma=False),
                                reason="no F16C conversions (CPU lacks them or CONVPROBE_NATIVE_FP16=0)")

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def assert_same_bits(actual, expected):
    """Exact equality of every bit, NaNs compared by NaN-ness (payloads are not modelled)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    nan_a = np.isnan(actual.astype(np.float64))
    nan_e = np.isnan(expected.astype(np.float64))
    np.testing.assert_array_equal(nan_a, nan_e)
    u = _UINT[actual.dtype.itemsize]
    bits_a = actual.view(u)[~nan_a]
    bits_e = expected.view(u)[~nan_e]
    bad = np.flatnonzero(bits_a != bits_e)
    assert bad.size == 0, (
        f"{bad.size} of {bits_a.size} differ; first: actual {actual[~nan_a][bad[:5]]!r} "
        f"expected {expected[~nan_e][bad[:5]]!r}"
    )


@pytest.fixture
def same_bits():
    return assert_same_bits


def random_fp16(rng, shape, lo=0x0001, hi=0x7C00):
    """fp16 values of both signs whose magnitudes' bit patterns are uniform in [lo, hi)
    (by default every finite nonzero magnitude)."""
    bits = rng.integers(lo, hi, size=shape, dtype=np.uint16)
    bits |= rng.integers(0, 2, size=shape, dtype=np.uint16) << 15
    return bits.view(np.float16)


def _finite_fp16(bits):
    x = bits.view(np.float16).copy()
    x[~np.isfinite(x)] = np.float16(65504)
    return x


def fp16_arrays(shape):
    """Hypothesis strategy: fp16 arrays over every finite bit pattern (no filtering),
    mixed with values near 1 (so sums do not just overflow) and edge values."""
    from hypothesis.extra import numpy as hnp

    edge = [0x0000, 0x8000, 0x0001, 0x8001, 0x0400, 0x03FF, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00,
            0x3C01, 0x3800, 0x0200]
    elements = (st.integers(0, 0xFFFF) | st.integers(0x3000, 0x4400)
                | st.integers(0xB000, 0xC400) | st.sampled_from(edge))
    return hnp.arrays(np.uint16, shape, elements=elements).map(_finite_fp16)


def budget(quick: int, thorough: int):
    """Two runs of one property: `quick` cases in the default suite, `thorough` under -m slow
    (the block-FMA model's 10,000: 6,000 + 2,000 in test_block_fma.py and 2,000 in
    test_composites.py; stochastic rounding's in test_native_stochastic.py)."""
    return pytest.mark.parametrize("cases_budget", [
        pytest.param(quick, id="quick"), pytest.param(thorough, id="thorough", marks=pytest.mark.slow)])


def run_cases(count: int, body) -> None:
    """Run the property `body(data)` on `count` derandomized hypothesis cases, and check that
    all `count` really ran (hypothesis stops early when it believes a space exhausted)."""
    ran = []

    def counted(data):
        body(data)
        ran.append(1)

    settings(max_examples=count, deadline=None, derandomize=True,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
        given(data=st.data())(counted))()
    assert len(ran) >= count, f"only {len(ran)} of {count} cases ran"


def signed_fp16(rng, shape):
    """Signed fp16 values over a wide exponent range, with subnormals and exact ties."""
    values = rng.standard_normal(shape) * np.exp2(rng.integers(-16, 6, shape))
    coarse = rng.random(shape) < 0.15  # small integers and halves: sums that tie
    values[coarse] = rng.integers(-64, 64, shape)[coarse] / 2
    tiny = rng.random(shape) < 0.05  # fp16 subnormals
    values[tiny] = rng.integers(-1023, 1024, shape)[tiny] * 2.0 ** -24
    return values.astype(np.float16)


@st.composite
def random_trees(draw, max_leaves=12):
    """A random tree: leaves shuffled, split into chains and fused nodes, some with a format."""
    k = draw(st.integers(1, max_leaves))
    leaves = draw(st.permutations(list(range(k))))

    def build(items):
        if len(items) == 1 and draw(st.booleans()):
            return items[0]
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(items) - 1)), max_size=3))) if len(items) > 1 else []
        parts = [items[i:j] for i, j in zip([0, *cuts], [*cuts, len(items)]) if items[i:j]]
        children = tuple(build(part) for part in parts) if len(parts) > 1 else tuple(items)
        node = Fused if draw(st.integers(0, 4)) == 0 and len(children) > 1 else Chain
        fmt = draw(st.sampled_from([None, None, "fp16", "fp32", "bf16"]))
        return node(children, None if fmt is None else parse_tree(f"(0)@{fmt}").format)

    root = build(list(leaves))
    return root if not isinstance(root, int) else Chain((root,))
