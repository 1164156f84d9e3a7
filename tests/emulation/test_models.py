"""Model objects, the spec grammar and input validation."""

import dataclasses

import numpy as np
import pytest

from convprobe import emulation as em
from convprobe.emulation.models import MODEL_KINDS, TENSOR_CORE_PRESETS
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP16, FP32, FP64, custom_format


def test_defaults_and_format_names():
    m = em.Sequential("fp16")
    assert m == em.Sequential(FP16) == em.Sequential()
    assert (m.product, m.addition, m.output, m.rounding, m.subnormals, m.overflow) == (
        "exact", "exact", FP16, "nearest_even", "keep", "inf")
    assert m.name == "sequential:fp16"
    assert m.output_dtype == np.float16
    assert em.Sequential(custom_format(5, 4)).output_dtype == np.float64
    assert em.Exact().accumulator == FP64
    assert em.Blocked().rounding == "toward_zero"
    assert "tensor" not in m.describe() and "fp16" in m.describe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.rounding = "toward_zero"


@pytest.mark.parametrize("spec,expected", [
    ("sequential:fp16", em.Sequential(FP16)),
    ("sequential:fp32", em.Sequential(FP32)),
    ("Sequential:half:addition=fp32", em.Sequential(FP16, addition=FP32)),
    ("sequential:fp16:product=fp16", em.Sequential(FP16, product=FP16)),
    ("blocked:fp16:b=4", em.Blocked(FP16, b=4)),
    ("blocked:fp32:b=8:extra=3:output=bf16", em.Blocked(FP32, b=8, extra_bits=3, output=BF16)),
    ("chunked:fp16:n=64", em.Chunked(FP16, chunk=64)),
    ("pairwise:bf16:rounding=sr:seed=3", em.Pairwise(BF16, rounding="stochastic", seed=3)),
    ("sequential:fp16:rounding=sr:rbits=32", em.Sequential(FP16, rounding="stochastic", rbits=32)),
    ("sequential:fp16:rounding=sr:rbits=13", em.Sequential(FP16, rounding="stochastic")),  # the default
    ("exact:fp64", em.Exact(FP64)),
    ("exact", em.Exact()),
    ("sequential:p11_emax15:order=chw", em.Sequential(custom_format(11, 15), order="chw")),
    ("a100", em.Blocked(FP32, b=8, extra_bits=1, adder=FP32)),
    ("v100:out=fp16", em.Blocked(FP16, b=4, rounding="nearest_even", adder=FP32)),
    ("h100:in=bf16", em.Blocked(FP32, b=16, extra_bits=2, input=BF16)),
    ("ada:in=e4m3", em.Blocked(FP32, b=16, extra_bits=-10, input="fp8_e4m3")),
    ("b200:in=fp8_e5m2:out=fp16", em.Blocked(FP16, b=16, extra_bits=2, adder=FP32, step=32,
                                            input="fp8_e5m2", rounding="nearest_even",
                                            layout="pair_interleaved", c_addition="separate")),
])
def test_parse_model(spec, expected):
    got = em.parse_model(spec)
    assert got == expected
    assert em.parse_model(got.to_spec()) == got
    assert got.to_dict()["spec"] == got.to_spec()


def test_every_kind_and_preset_parses():
    for kind in [*MODEL_KINDS, *TENSOR_CORE_PRESETS]:
        assert em.parse_model(kind).to_spec()


@pytest.mark.parametrize("spec,message", [
    ("serial:fp16", "model must be one of sequential, pairwise, blocked, chunked, exact, v100, "
                    "a100, a2, a30, ada, l40s, h100, h200, b200; received 'serial'"),
    ("v100:in=bf16", "in for v100 must be one of fp16; received 'bf16'"),
    ("a100:in=tf32:out=fp16", "out=fp16 needs fp16 or fp8 inputs"),
    ("h100:out=fp64", "out must be one of fp32, fp16; received 'fp64'"),
    ("blocked:fp32:b=4:rounding=stochastic", "rounding of a blocked model must be one of"),
    ("sequential:fp16:rbits=20", "rbits needs rounding=stochastic; received rbits=20 with rounding=nearest_even"),
    ("sequential:fp16:rounding=sr:rbits=33", "rbits must be an integer from 1 to 32 for the accumulator format fp16; received 33"),
    ("chunked:fp16:n=4:rounding=sr:rbits=28", "rbits must be an integer from 1 to 27 for the total format fp32; received 28"),
    ("sequential:fp16:rounding=sr:rbits=0", "rbits must be an integer from 1 to 32"),
    ("blocked:fp32:b=4:layout=zigzag", "layout must be one of contiguous, pair_interleaved"),
    ("blocked:fp32:b=4:truncate=maybe", "truncate must be one of true, false; received 'maybe'"),
    ("blocked:fp32:b=4:step=6", "step must be a multiple of b"),
    ("blocked:fp32:b=4:extra=-23", "extra_bits must be at least -22"),
    ("sequential:fp12", "accumulator must be one of"),
    ("blocked:fp16:b=0", "b must be an integer >= 1; received 0"),
    ("blocked:fp16:b=-3", "b must be an integer >= 1"),
    ("blocked:fp16:b=four", "b must be an integer; received 'four'"),
    ("chunked:fp16:n=0", "chunk must be an integer >= 1"),
    ("sequential:fp16:rounding=up", "rounding must be one of nearest_even, toward_zero, "
                                    "stochastic; received 'up'"),
    ("sequential:fp16:order=hhw", "order must be one of hwc, hcw"),
    ("sequential:fp16:colour=red", "sequential model parameter must be one of"),
    ("exact:fp64:rounding=stochastic", "stochastic rounding needs accumulator precision"),
    ("sequential:p52_emax100", "accumulator precision must be at most 51"),
    ("blocked:fp32:b=4:extra=40", "p_adder \\+ extra_bits"),
    ("", "model spec must be a non-empty string"),
])
def test_bad_specs_say_what_is_valid(spec, message):
    with pytest.raises(InvalidArgument, match=message):
        em.parse_model(spec)


def test_bad_conv_inputs():
    x = np.ones((1, 4, 4, 3), np.float16)
    w = np.ones((3, 3, 2, 4), np.float16)
    m = em.Sequential()
    with pytest.raises(InvalidArgument, match=r"w input channels \(2\) times groups \(1\) must equal x channels \(3\)"):
        em.conv2d(x, w, m)
    with pytest.raises(InvalidArgument, match="padding must be one of VALID, SAME"):
        em.conv2d(x, np.ones((3, 3, 3, 4), np.float16), m, padding="FULL")
    with pytest.raises(InvalidArgument, match="strides must be a positive integer"):
        em.conv2d(x, np.ones((3, 3, 3, 4), np.float16), m, strides=0)
    with pytest.raises(InvalidArgument, match="groups must be a positive integer"):
        em.conv2d(x, np.ones((3, 3, 3, 4), np.float16), m, groups=0)
    with pytest.raises(InvalidArgument, match="must be divisible by groups"):
        em.conv2d(np.ones((1, 4, 4, 4)), np.ones((3, 3, 2, 3)), m, groups=2)
    with pytest.raises(InvalidArgument, match="too small"):
        em.conv2d(np.ones((1, 2, 2, 3), np.float16), np.ones((3, 3, 3, 1), np.float16), m)
    with pytest.raises(InvalidArgument, match="model must be an AccumulationModel"):
        em.conv2d(x, np.ones((3, 3, 3, 4), np.float16), "sequential:fp16")
    with pytest.raises(InvalidArgument, match="4-D NHWC"):
        em.conv2d(x[0], w, m)


def test_float64_inputs_must_give_exact_products():
    a = np.array([1 / 3, 1.0])
    with pytest.raises(InvalidArgument, match="more than 26 significand bits"):
        em.dot(a, a, em.Sequential())
    # values with few significand bits are fine in float64, and product=fp64 rounds on purpose
    assert em.dot(np.array([0.5, 3.0]), np.array([2.0, 4.0]), em.Exact()) == 13.0
    assert em.dot(a, a, em.Exact(product=FP64)) == np.float64(1 / 3) * np.float64(1 / 3) + 1.0


def test_dot_broadcasts_and_rejects_mismatch():
    a = np.ones((2, 3, 5), np.float16)
    b = np.ones((5,), np.float16)
    assert em.dot(a, b, em.Sequential()).shape == (2, 3)
    with pytest.raises(InvalidArgument, match="same last axis length"):
        em.dot(a, np.ones(4, np.float16), em.Sequential())


def test_infinities_a_format_cannot_hold_are_rejected():
    x = np.array([np.inf, 1.0], np.float16)
    with pytest.raises(InvalidArgument, match="a contains inf, which the accumulator format "
                                              "fp8_e4m3 cannot represent"):
        em.dot(x, x, em.Sequential("fp8_e4m3"))
    with pytest.raises(InvalidArgument, match="output format fp8_e4m3"):
        em.conv2d(x.reshape(1, 1, 2, 1), np.ones((1, 1, 1, 1), np.float16),
                  em.Sequential(FP16, output="fp8_e4m3"))
    y = np.array([np.nan, 1.0], np.float16)
    assert np.isnan(em.dot(y, y, em.Sequential("fp8_e4m3")))


def test_importing_the_engine_does_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys, convprobe.emulation as e; e.parse_model('sequential:fp16'); "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
