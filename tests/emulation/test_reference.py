"""The emulator against ordinary float64/float32 convolutions."""

import math

import numpy as np
import pytest

from convprobe import emulation as em
from convprobe.formats import FP32, FP64


def reference_conv(x, w, strides, padding):
    """Plain float64 NHWC/HWIO convolution via explicit padding and einsum."""
    (pt, pb), (pl, pr) = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    kh, kw = w.shape[:2]
    oh = (xp.shape[1] - kh) // strides + 1
    ow = (xp.shape[2] - kw) // strides + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i: i + (oh - 1) * strides + 1: strides, j: j + (ow - 1) * strides + 1: strides]
            out += np.einsum("nhwc,co->nhwo", patch, w[i, j].astype(np.float64))
    return out


def test_exact_fp64_equals_float64_conv_when_float64_is_exact():
    """Integer-valued inputs: every float64 partial sum is exact, so any order agrees."""
    rng = np.random.default_rng(3)
    x = rng.integers(-50, 50, (2, 9, 9, 4)).astype(np.float32)
    w = rng.integers(-50, 50, (3, 3, 4, 5)).astype(np.float32)
    got = em.conv2d(x, w, em.Exact(FP64), strides=2, padding=[(1, 1), (1, 1)])
    want = reference_conv(x, w, 2, ((1, 1), (1, 1)))
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def test_exact_fp64_within_float64_rounding_of_reference():
    """Random fp16 inputs: the emulator is the exact sum rounded once, the reference
    has error <= gamma_K * sum|x w| with gamma_K = K u / (1 - K u), u = 2**-53
    (Higham, Accuracy and Stability, Lemma 3.1), plus half an ulp for our rounding."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 8, 8, 6)).astype(np.float16)
    w = rng.standard_normal((3, 3, 6, 4)).astype(np.float16)
    got = em.conv2d(x, w, em.Exact(FP64), padding="SAME")
    pads = ((1, 1), (1, 1))
    want = reference_conv(x, w, 1, pads)
    absref = reference_conv(np.abs(x), np.abs(w), 1, pads)
    k = 3 * 3 * 6
    u = 2.0**-53
    gamma = k * u / (1 - k * u)
    bound = gamma * absref * (1 + 2 * u) + u * np.abs(got)
    assert (np.abs(got - want) <= bound).all()
    # and it differs from fp64 sequential only by rounding, never more than the same bound
    seq = em.conv2d(x, w, em.Sequential(FP64), padding="SAME")
    assert (np.abs(seq - got) <= bound).all()


@pytest.mark.tensorflow
def test_sequential_fp32_agrees_with_tensorflow_fp32_within_bound():
    """TF's fp32 conv and the emulator's fp32 sequential sum both have error at most
    gamma_K(u32) * sum|x w| from the exact sum, so they differ by at most twice that."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 8, 8)).astype(np.float16)
    w = rng.standard_normal((3, 3, 8, 4)).astype(np.float16)
    got = em.conv2d(x, w, em.Sequential(FP32), padding="SAME").astype(np.float64)
    native = tf.nn.conv2d(tf.constant(x.astype(np.float32)), tf.constant(w.astype(np.float32)),
                          1, "SAME").numpy().astype(np.float64)
    absref = reference_conv(np.abs(x), np.abs(w), 1, ((1, 1), (1, 1)))
    k = 3 * 3 * 8
    u = 2.0**-24
    gamma = k * u / (1 - k * u)
    assert (np.abs(got - native) <= 2 * gamma * absref).all()
    exact = em.conv2d(x, w, em.Exact(FP64), padding="SAME")
    assert (np.abs(got - exact) <= gamma * absref).all()
    assert math.isfinite(float(np.abs(got - native).max()))
