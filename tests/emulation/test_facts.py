"""The published facts the emulator must reproduce (DESIGN.md, issue 3)."""

import numpy as np
import pytest

from convprobe.emulation import Blocked, Exact, Sequential, conv2d, dot, oracle
from convprobe.formats import FP16, FP32

X = np.array([65519] * 4, dtype=np.float16).reshape(1, 1, 4, 1)  # 65519 -> 65504 in fp16
W = np.array([65519, -65519], dtype=np.float16).reshape(1, 2, 1, 1)


@pytest.mark.parametrize("engine", [conv2d, oracle.conv2d], ids=["engine", "oracle"])
def test_three_outcomes_of_the_65519_test(engine):
    with np.errstate(over="ignore", invalid="ignore"):
        fma16 = engine(X, W, Sequential(FP16))
        wide = engine(X, W, Sequential(FP32))
        rounded = engine(X, W, Sequential(FP16, product=FP16))
    assert fma16.dtype == np.float16 and wide.dtype == np.float32
    assert np.isposinf(fma16).all()
    assert (wide == 0).all()
    assert np.isnan(rounded).all()


def test_sum_of_8192_ones_in_fp16_is_2048():
    ones = np.ones(8192, dtype=np.float16)
    assert dot(ones, ones, Sequential("fp16")) == np.float16(2048)
    assert dot(ones, ones, Sequential("fp32")) == np.float32(8192)
    assert dot(ones, ones, Exact("fp16")) == np.float16(8192)


@pytest.mark.parametrize("gap", range(1, 10))
def test_blocked_b4_reveals_its_block_size(gap):
    """+p at tap 0 and -p at tap `gap`: same block (gap < 4) -> 0, else the fp16 block
    result overflows to inf and stays there."""
    x = np.full((1, 1, gap + 1, 1), 65504, dtype=np.float16)
    w = np.zeros((1, gap + 1, 1, 1), dtype=np.float16)
    w[0, 0], w[0, gap] = 65504, -65504
    with np.errstate(over="ignore"):
        got = conv2d(x, w, Blocked(FP16, b=4))
        want = oracle.conv2d(x, w, Blocked(FP16, b=4))
    assert got.view(np.uint16) == want.view(np.uint16)
    assert got.ravel()[0] == (0 if gap < 4 else np.inf)


@pytest.mark.parametrize("model", [Sequential(FP32), Sequential(FP32, rounding="toward_zero")],
                         ids=lambda m: m.to_spec())
@pytest.mark.parametrize("engine", [dot, oracle.dot], ids=["engine", "oracle"])
def test_double_rounding_witness(engine, model):
    """1 + p with p = 2**-24 (1 + 2**-32) = (641 * 2**-33) * (6700417 * 2**-23) (F5 = 641 *
    6700417, both fp32). float64 rounds 1 + p to the fp32 tie 1 + 2**-24, which then rounds
    to even (1.0): double rounding. The correct fp32 sum is 1 + 2**-23 (nearest) and
    1.0 (toward zero). Only a correct rounding of the exact sum passes."""
    a = np.array([1.0, 641 * 2.0**-33], dtype=np.float32)
    b = np.array([1.0, 6700417 * 2.0**-23], dtype=np.float32)
    want = 1 + 2.0**-23 if model.rounding == "nearest_even" else 1.0
    assert engine(a, b, model) == np.float32(want)
    # the trap is real: float64 arithmetic then one cast gets it wrong
    assert np.float32(np.float64(a[0]) * b[0] + np.float64(a[1]) * b[1]) == np.float32(1.0)


@pytest.mark.parametrize("engine", [dot, oracle.dot], ids=["engine", "oracle"])
def test_fp64_toward_zero_overflow_rule(engine):
    """max + 2**970 is below 2**1024: nearest-even ties up to overflow (inf), truncation
    keeps max. Products are rounded to fp64 (identity here) because max has 53 bits."""
    top = np.finfo(np.float64).max
    a = np.array([top, 2.0**970])
    b = np.ones(2)
    with np.errstate(over="ignore"):
        rz = engine(a, b, Sequential("fp64", product="fp64", rounding="toward_zero"))
        rn = engine(a, b, Sequential("fp64", product="fp64"))
    assert rz == top
    assert rn == np.inf


@pytest.mark.parametrize("engine", [dot, oracle.dot], ids=["engine", "oracle"])
def test_fp32_addition_double_rounds_fp16_sums(engine):
    """CPU half arithmetic (add in fp32, round to fp16) differs from a fused fp16 chain:
    1 + 145 * 2**-13 * 113 * 2**-12 = 1 + 2**-11 + 2**-25 (2**14 + 1 = 145 * 113) is just
    above the fp16 tie, but fp32 rounds it onto the tie, which then rounds to even."""
    a = np.array([1, 145 * 2.0**-13], dtype=np.float16)
    b = np.array([1, 113 * 2.0**-12], dtype=np.float16)
    assert engine(a, b, Sequential(FP16)) == np.float16(1 + 2.0**-10)
    assert engine(a, b, Sequential(FP16, addition=FP32)) == np.float16(1.0)
