"""The float32 FMA kernel (sequential fp32 accumulation of fp16 products) equals the float64
kernels and the Fraction oracle bit for bit."""

import numpy as np
import pytest

from convprobe import emulation as em
from convprobe.emulation import _kernels as K
from convprobe.emulation.models import kernel_config
from convprobe.formats import BF16, FP16, FP32

from .conftest import assert_same_bits, random_fp16


def test_the_float32_kernel_equals_the_general_kernel():
    """Every finite fp16 magnitude and both signs (products down to 2**-48 and up to
    about 2**32, sums that overflow fp32 do not occur, sums that cancel do), rows in the
    four-row blocks and left over."""
    model = em.Sequential(FP32)
    fp, ic, seed = kernel_config(model)
    assert K.native_fp32(fp, ic, True) and not K.native_fp32(fp, ic, False)
    rng = np.random.default_rng(7)
    for m, k, n in ((203, 77, 9), (64, 600, 3)):
        a, w = random_fp16(rng, (m, k)), random_fp16(rng, (k, n))
        a[1] = -a[0]  # a row whose sums cancel against the row above
        got = np.empty((m, n), np.float32)
        K.gemm(a.astype(np.float32), w.astype(np.float32), fp, ic, seed, got, 0, inputs_fp16=True)
        want = np.empty((m, n))
        K.gemm(a.astype(np.float64), w.astype(np.float64), fp, ic, seed, want, 0, inputs_fp16=True, fast=False)
        assert_same_bits(got.astype(np.float64), want)


@pytest.mark.parametrize("spec", ["sequential:fp32", "lanes(4, sequential:fp32, combine=pairwise:fp32)"])
def test_conv_on_fp16_inputs_takes_float32_and_matches_the_oracle(spec):
    model = em.parse_model(spec)
    inner = getattr(model, "inner", model)
    assert inner.carrier(True) == np.float32 and inner.carrier(False) == np.float64
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 5, 6)).astype(np.float16)
    w = rng.standard_normal((3, 3, 6, 4)).astype(np.float16)
    got = em.conv2d(x, w, model, padding="SAME")
    assert got.dtype == np.float32
    assert_same_bits(got, em.oracle.conv2d(x, w, model, padding="SAME"))
    dy = rng.standard_normal(got.shape).astype(np.float16)
    assert_same_bits(em.conv2d_backprop_input(dy, w, x.shape, model, padding="SAME"),
                     em.oracle.conv2d_backprop_input(dy, w, x.shape, model, padding="SAME"))
    assert_same_bits(em.conv2d_backprop_filter(x, dy, w.shape, model, padding="SAME"),
                     em.oracle.conv2d_backprop_filter(x, dy, w.shape, model, padding="SAME"))


@pytest.mark.parametrize("model", [em.Sequential(FP32, subnormals="flush"), em.Sequential(FP32, addition=BF16),
                                   em.Sequential(FP16), em.Sequential(FP32, rounding="toward_zero")],
                         ids=lambda m: m.to_spec())
def test_other_models_do_not_take_the_float32_kernel(model):
    fp, ic, _ = kernel_config(model)
    assert not K.native_fp32(fp, ic, True)
