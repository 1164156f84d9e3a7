"""The specialised sequential kernels equal the general kernel bit for bit."""

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from convprobe import emulation as em
from convprobe.emulation import _kernels as K
from convprobe.formats import BF16, FP8_E5M2, FP16, FP32, custom_format

from .conftest import assert_same_bits, fp16_arrays

@contextlib.contextmanager
def general_kernel():
    """Route reductions through the general kernel for the duration."""
    K.FAST_PATH = False
    try:
        yield
    finally:
        K.FAST_PATH = True


SEQUENTIAL = [
    em.Sequential(FP16),
    em.Sequential(FP16, rounding="toward_zero"),
    em.Sequential(FP16, rounding="stochastic", seed=4),
    em.Sequential(FP16, addition=FP32),
    em.Sequential(FP16, addition="fp64"),
    em.Sequential(FP16, product=FP16, subnormals="flush"),
    em.Sequential(FP16, overflow="saturate", output=FP32),
    em.Sequential(FP32),
    em.Sequential(BF16, rounding="stochastic", seed=2),
    em.Sequential(FP8_E5M2),
    em.Sequential("fp64"),
    em.Sequential("fp64", overflow="saturate"),
    em.Sequential(custom_format(9, 6, subnormals=False)),
]

@pytest.mark.parametrize("model", SEQUENTIAL, ids=lambda m: m.to_spec())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=fp16_arrays((2, 3, 4, 3)), w=fp16_arrays((2, 2, 3, 5)))
def test_fast_kernels_equal_general_kernel(model, x, w):
    with np.errstate(all="ignore"):
        fast = em.conv2d(x, w, model, padding="SAME")
        with general_kernel():
            general = em.conv2d(x, w, model, padding="SAME")
    assert_same_bits(fast, general)


@pytest.mark.parametrize("model", SEQUENTIAL[:4], ids=lambda m: m.to_spec())
def test_fast_kernels_propagate_inf_and_nan(model):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 2.0, 65504.0], dtype=np.float16).reshape(1, 1, 6, 1)
    w = np.array([1.0, 1.0, 0.5], dtype=np.float16).reshape(1, 3, 1, 1)
    with np.errstate(all="ignore"):
        fast = em.conv2d(x, w, model)
        with general_kernel():
            general = em.conv2d(x, w, model)
        want = em.oracle.conv2d(x, w, model)
    assert_same_bits(fast, general)
    assert_same_bits(fast, want)
