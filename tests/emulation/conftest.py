"""Shared helpers for the emulation tests: bit-exact comparison."""

import numpy as np
import pytest

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
