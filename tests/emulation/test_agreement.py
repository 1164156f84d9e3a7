"""Vectorised engine == exact-rational oracle, bit for bit, for every model and format."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from convprobe import emulation as em
from convprobe.emulation import oracle, tree_reference
from convprobe.errors import InvalidArgument
from convprobe.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, custom_format

from .conftest import assert_same_bits, fp16_arrays

MODELS = [
    em.Sequential(FP16),
    em.Sequential(FP32),
    em.Sequential(FP16, product=FP16),
    em.Sequential(FP16, addition=FP32),
    em.Sequential(BF16, rounding="toward_zero"),
    em.Sequential(FP16, rounding="stochastic", seed=11),
    em.Sequential(FP16, subnormals="flush", overflow="saturate"),
    em.Sequential(FP8_E4M3, output=FP16),
    em.Sequential(FP8_E5M2, rounding="stochastic", seed=3),
    em.Sequential(custom_format(6, 9)),
    em.Sequential("fp64", rounding="toward_zero"),
    em.Pairwise(FP16),
    em.Pairwise(FP16, rounding="stochastic", seed=5),
    em.Blocked(FP16, b=4),
    em.Blocked(FP32, b=8, extra_bits=3, output=FP16),
    em.Blocked(FP16, b=2, rounding="nearest_even"),
    em.Chunked(FP16, chunk=3),
    em.Chunked(BF16, chunk=2, rounding="stochastic", seed=9),
    em.Exact("fp64"),
    em.Exact(FP16),
    em.Exact(FP8_E4M3, overflow="saturate"),
    em.Exact(FP16, rounding="toward_zero", subnormals="flush"),
    em.Exact(FP16, rounding="stochastic", seed=1),
]


@st.composite
def conv_case(draw):
    n = draw(st.integers(1, 2))
    groups = draw(st.sampled_from([1, 1, 2]))
    cg = draw(st.integers(1, 2))
    og = draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    strides = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = draw(st.sampled_from(["VALID", "SAME", [(1, 0), (0, 2)]]))
    h = draw(st.integers((kh - 1) * dilation[0] + 1, (kh - 1) * dilation[0] + 3))
    w = draw(st.integers((kw - 1) * dilation[1] + 1, (kw - 1) * dilation[1] + 3))
    x = draw(fp16_arrays((n, h, w, cg * groups)))
    f = draw(fp16_arrays((kh, kw, cg, og * groups)))
    return x, f, dict(strides=strides, padding=padding, dilation=dilation, groups=groups)


SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.to_spec())
@SETTINGS
@given(case=conv_case(), order=st.sampled_from(["hwc", "chw", "wch"]))
def test_conv2d_matches_oracle(model, case, order):
    x, f, kw = case
    model = dataclasses.replace(model, order=order)
    with np.errstate(all="ignore"):
        got = em.conv2d(x, f, model, **kw)
        want = oracle.conv2d(x, f, model, **kw)
    assert_same_bits(got, want)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.to_spec())
@SETTINGS
@given(a=fp16_arrays((3, 17)), b=fp16_arrays((17,)))
@example(a=np.full((3, 17), 65504, np.float16), b=np.array([1, -1] * 8 + [1], np.float16))
def test_dot_matches_oracle(model, a, b):
    got = em.dot(a, b, model)
    want = oracle.dot(a, b, model)
    assert_same_bits(got, want)


@pytest.mark.parametrize("model", MODELS[::3], ids=lambda m: m.to_spec())
@SETTINGS
@given(case=conv_case())
def test_gradients_match_oracle(model, case):
    x, f, kw = case
    dy_shape = em.conv2d(x, f, em.Exact(), **kw).shape
    rng = np.random.default_rng(0)
    dy = rng.standard_normal(dy_shape).astype(np.float16)
    with np.errstate(all="ignore"):
        gi = em.conv2d_backprop_input(dy, f, x.shape, model, **kw)
        gi_o = oracle.conv2d_backprop_input(dy, f, x.shape, model, **kw)
        gf = em.conv2d_backprop_filter(x, dy, f.shape, model, **kw)
        gf_o = oracle.conv2d_backprop_filter(x, dy, f.shape, model, **kw)
    assert_same_bits(gi, gi_o)
    assert_same_bits(gf, gf_o)


FP32_MODELS = [em.Sequential(FP32), em.Sequential(BF16, addition=FP32), em.Pairwise(FP32),
               em.Blocked(FP32, b=4, extra_bits=3, input=FP32), em.Chunked(FP32, chunk=4, total="fp64"),
               em.Exact(FP32, rounding="toward_zero")]


@pytest.mark.parametrize("model", FP32_MODELS, ids=lambda m: m.to_spec())
@SETTINGS
@given(a=hnp.arrays(np.float32, (2, 9), elements=st.floats(width=32, min_value=-1e6, max_value=1e6)),
       b=hnp.arrays(np.float32, (9,), elements=st.floats(width=32, min_value=-1e6, max_value=1e6)))
def test_fp32_inputs_match_oracle(model, a, b):
    """fp32 inputs give 48-bit products: sums where float64 alone would double-round."""
    assert_same_bits(em.dot(a, b, model), oracle.dot(a, b, model))


@pytest.mark.parametrize("model", [m for m in MODELS if m.accumulator.has_inf and m.output.has_inf],
                         ids=lambda m: m.to_spec())
def test_inf_and_nan_propagate_like_the_oracle(model):
    a = np.array([[1.0, np.inf, 2.0, 3.0, 1.0], [np.inf, 1.0, -np.inf, 0.0, 2.0],
                  [np.nan, 1.0, 1.0, 1.0, 1.0], [0.0, np.inf, 1.0, 1.0, -1.0],
                  [65504.0, 65504.0, -np.inf, 1.0, 1.0]], dtype=np.float16)
    b = np.array([1.0, 1.0, -1.0, 0.5, 2.0], dtype=np.float16)
    with np.errstate(all="ignore"):
        assert_same_bits(em.dot(a, b, model), oracle.dot(a, b, model))


@pytest.mark.parametrize("spec", ["sequential:fp16:product=fp16:positions=hwn", "chunked:fp16:n=5:positions=hwn",
                                  "pairwise:fp32:output=fp16:positions=hwn", "v100:positions=hwn",
                                  "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, positions=hwn)",
                                  "splitk(length=7, sequential:fp16, combine=fp32, output=fp16, positions=hwn)",
                                  "reverse(sequential:fp16, positions=hwn)",
                                  "columns(sequential:fp16, lanes(2, sequential:fp16, combine=sequential:fp16) * 2, "
                                  "positions=hwn)",
                                  "rows(sequential:fp16 * 2, splitk(length=3, sequential:fp16, combine=fp16), "
                                  "positions=hwn)"])
def test_filter_gradients_with_the_batch_innermost_match_the_oracle(spec):
    """positions=hwn sums a filter gradient over (oh, ow, n): the emulator and the oracle
    agree, and the order shows: B at (n=0, oh=0, ow=0), then 1 at (n=1, 0, 0) and -B at
    (0, 0, 1). Image by image the 1 comes last (1); batch innermost it meets B first, and
    2048 + 1 ties back to 2048 (0)."""
    model = em.parse_model(spec)
    assert em.parse_model(model.to_spec()) == model
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5, 2)).astype(np.float16)
    dy = rng.standard_normal((3, 4, 5, 3)).astype(np.float16)
    with np.errstate(all="ignore"):
        got = em.conv2d_backprop_filter(x, dy, (1, 1, 2, 3), model)
        assert_same_bits(got, oracle.conv2d_backprop_filter(x, dy, (1, 1, 2, 3), model))
        image_by_image = em.conv2d_backprop_filter(x, dy, (1, 1, 2, 3), dataclasses.replace(model, positions="nhw"))
    if "fp32" not in spec:  # an fp32 sum of 60 fp16 products rounds to the same fp16 in both orders here
        assert not np.array_equal(got.view(np.uint16), image_by_image.view(np.uint16))  # the order is taken
    x = np.zeros((2, 1, 2, 1), np.float16)
    x[0, 0, 0], x[1, 0, 0], x[0, 0, 1] = 2048.0, 1.0, -2048.0
    dy = np.ones((2, 1, 2, 1), np.float16)
    fp16 = em.parse_model("sequential:fp16")
    assert em.conv2d_backprop_filter(x, dy, (1, 1, 1, 1), fp16).item() == 1.0
    hwn = em.parse_model("sequential:fp16:positions=hwn")
    assert em.conv2d_backprop_filter(x, dy, (1, 1, 1, 1), hwn).item() == 0.0
    assert oracle.conv2d_backprop_filter(x, dy, (1, 1, 1, 1), hwn).item() == 0.0


def test_positions_belong_to_the_outermost_model():
    """The whole sum's order is the outermost model's, composites included; not an inner one's."""
    with pytest.raises(InvalidArgument, match="cannot set positions"):
        em.parse_model("splitk(2, sequential:fp16:positions=hwn, combine=fp32)")
    with pytest.raises(InvalidArgument, match="cannot set positions"):
        em.parse_model("rows(lanes(2, sequential:fp16, combine=sequential:fp16, positions=hwn))")
    lanes = em.parse_model("lanes(2, sequential:fp16, combine=sequential:fp16, positions=hwn)")
    assert lanes.positions == "hwn" and em.parse_model(lanes.to_spec()) == lanes
    with pytest.raises(InvalidArgument, match="columns cannot set positions"):
        em.parse_model("rows(columns(sequential:fp16, sequential:fp16, positions=hwn), sequential:fp16)")


@pytest.mark.parametrize("spec", ["sequential:fp32:output=fp16", "sequential:fp16:addition=fp32", "pairwise:fp16",
                                  "v100:out=fp16", "lanes(2, sequential:fp32, combine=sequential:fp32, output=fp16)",
                                  "splitk(length=3, sequential:fp16:addition=fp32, combine=pairwise:fp16)",
                                  "reverse(pairwise:fp16)", "rows(sequential:fp32:output=fp16 * 2, pairwise:fp16)"])
def test_positive_zeros_turn_exactly_the_negative_zeros_to_plus_zero(spec):
    """zeros=positive lands each result on +0, as a kernel that adds its sum onto a zeroed
    output does: a -0 becomes +0 and no other bit changes, in the emulator and the oracle
    alike, on every op. Signed inputs with tiny products make -0 results; the test first
    checks that they do, so that the option is seen to act."""
    signed = em.parse_model(spec)
    positive = dataclasses.replace(signed, zeros="positive")
    assert positive.zeros == "positive" and em.parse_model(positive.to_spec()) == positive
    assert "zeros=positive" in positive.to_spec() and "+0" in positive.describe()
    rng = np.random.default_rng(11)
    x = (rng.choice([-1.0, 1.0], (2, 3, 3, 2)) * 2.0 ** rng.integers(-24, -10, (2, 3, 3, 2))).astype(np.float16)
    w = (rng.choice([-1.0, 1.0], (1, 3, 2, 4)) * 2.0 ** rng.integers(-24, -12, (1, 3, 2, 4))).astype(np.float16)
    x[0] = 0.0  # all-zero products too: -0 and +0 terms
    with np.errstate(all="ignore"):
        for model in (signed, positive):
            assert_same_bits(em.conv2d(x, w, model, padding="SAME"), oracle.conv2d(x, w, model, padding="SAME"))
        before = em.conv2d(x, w, signed, padding="SAME").view(np.uint16)
        after = em.conv2d(x, w, positive, padding="SAME").view(np.uint16)
    negative_zero = before == 0x8000
    assert negative_zero.any(), "the inputs make no -0 result: the test would show nothing"
    assert (after[negative_zero] == 0).all()
    assert np.array_equal(after[~negative_zero], before[~negative_zero])
    if not isinstance(signed, em.Rows):
        assert em.dot(np.float16([2**-12]), np.float16([-2**-13]), positive).view(np.uint16) == 0
        assert oracle.dot(np.float16([2**-12]), np.float16([-2**-13]), positive).view(np.uint16) == 0


def test_a_tree_with_positive_zeros_lands_on_plus_zero_as_its_reference_does():
    a, b = np.float16([2**-13, 0.0, 2**-15]), np.float16([-2**-13, 1.0, -2**-15])  # sum -(2**-26 + 2**-30)
    for zeros, bits in (("signed", 0x8000), ("positive", 0)):
        tree = em.parse_model(f"tree(((0 1) 2), accumulator=fp32, output=fp16, zeros={zeros})")
        assert em.parse_model(tree.to_spec()) == tree
        assert em.dot(a, b, tree).view(np.uint16) == bits
        assert np.float16(tree_reference.reduce([float(v) for v in a], [float(v) for v in b], tree)).view(np.uint16) == bits


def test_zeros_belong_to_the_outermost_model():
    with pytest.raises(InvalidArgument, match="cannot set zeros"):
        em.parse_model("splitk(2, sequential:fp16:zeros=positive, combine=fp32)")
    with pytest.raises(InvalidArgument, match="columns cannot set zeros"):
        em.parse_model("rows(columns(sequential:fp16, zeros=positive), sequential:fp16)")
    with pytest.raises(InvalidArgument, match="zeros must be one of signed, positive; received 'plus'"):
        em.parse_model("sequential:fp16:zeros=plus")
