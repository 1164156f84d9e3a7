"""Composite models (split-K, lanes) with any inner model: the NumPy path equals the
exact oracle (`oracle.reduce` recomputes each part from its definition), for dot and
for convolutions; their specs round-trip."""

import numpy as np
import pytest
from hypothesis import strategies as st

from convprobe import emulation as em
from convprobe.emulation import oracle
from convprobe.errors import InvalidArgument
from convprobe.testing.strategies import fp16_arrays

from .conftest import assert_same_bits, budget, needs_f16c, run_cases

INNER = ["sequential:fp16", "sequential:fp32", "sequential:fp32:output=fp16",
         "sequential:fp16:product=fp16", "pairwise:fp32", "chunked:fp16:n=5",
         "exact:fp32", "a100", "v100:out=fp16", "h100", "blocked:fp16:b=3"]


@st.composite
def composites(draw, depth=0):
    inner = draw(st.sampled_from(INNER)) if depth else draw(
        st.one_of(st.sampled_from(INNER), composites(depth=1)))
    if draw(st.booleans()):
        size = (str(draw(st.integers(1, 6))) if draw(st.booleans())
                else f"length={draw(st.integers(1, 24))}")
        combine = draw(st.sampled_from(["fp16", "fp32", "bf16", "pairwise:fp32", "pairwise:fp16:output=fp32"]))
        output = draw(st.sampled_from(["", ", output=fp16"]))
        first = draw(st.lists(st.sampled_from(INNER), max_size=3))
        first = f", first={' | '.join(first)}" if first else ""
        return f"splitk({size}, {inner}{first}, combine={combine}{output})"
    if draw(st.integers(0, 4)) == 0:
        return f"reverse({inner}{draw(st.sampled_from(['', ', output=fp16']))})"
    combine = draw(st.sampled_from(["sequential:fp32", "pairwise:fp16", "sequential:fp32:output=fp16",
                                    "exact:fp32", "reverse(sequential:fp16)"]))
    output = draw(st.sampled_from(["", ", output=fp16"]))
    plain = inner in INNER and inner.split(":")[0] in ("sequential", "pairwise", "chunked", "exact")
    holds = "product=fp16" not in inner or combine in ("pairwise:fp16", "sequential:fp32:output=fp16",
                                                       "reverse(sequential:fp16)")  # the tail's first product
    tail = draw(st.sampled_from(["", ", tail=1", ", tail=3", ", tail=60"])) if plain and holds else ""
    return f"lanes({draw(st.integers(1, 9))}, {inner}, combine={combine}{tail}{output})"


@budget(300, 2000)
def test_composites_match_the_oracle(cases_budget):
    def body(data):
        model = em.parse_model(data.draw(composites()))
        assert em.parse_model(model.to_spec()) == model
        k = data.draw(st.integers(1, 48))
        a = data.draw(fp16_arrays((2, k), min_value=-8, max_value=8))
        b = data.draw(fp16_arrays((2, k), min_value=-8, max_value=8))
        with np.errstate(all="ignore"):
            assert_same_bits(em.dot(a, b, model), oracle.dot(a, b, model))

    run_cases(cases_budget, body)


@pytest.mark.parametrize("spec", ["splitk(3, a100, combine=fp16)",
                                  "splitk(length=6, sequential:fp16:product=fp16, first=sequential:fp16 | lanes(2, "
                                  "sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
                                  "columns(splitk(length=3, sequential:fp16, first=pairwise:fp16, combine=fp16), "
                                  "sequential:fp16:product=fp16, chunked:fp16:n=4)",
                                  "splitk(length=4, sequential:fp16, combine=fp32, output=fp16)",
                                  "lanes(4, h100, combine=pairwise:fp32)",
                                  "splitk(2, lanes(3, v100, combine=sequential:fp32), combine=fp32)",
                                  "reverse(chunked:fp16:n=5)", "lanes(8, sequential:fp32, combine=pairwise:fp32)",
                                  "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, tail=5)",
                                  "lanes(4, sequential:fp32, combine=pairwise:fp32, tail=3, output=fp16)",
                                  "rows(lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16) * 5, "
                                  "sequential:fp16:product=fp16)",
                                  "rows(columns(sequential:fp16:product=fp16 * 2, pairwise:fp16) * 3, "
                                  "columns(sequential:fp16, chunked:fp16:n=4), sequential:fp32:output=fp16)"])
def test_composite_convolutions_and_gradients_match_the_oracle(spec):
    """On fp16 inputs, through the composite's float32 carrier (its output fits) and each
    inner model's own."""
    model = em.parse_model(spec)
    assert model.carrier(True) == np.float32 and model.carrier(False) == np.float64
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 5, 5, 6)).astype(np.float16)
    w = rng.standard_normal((3, 3, 6, 3)).astype(np.float16)
    dy = rng.standard_normal((1, 3, 3, 3)).astype(np.float16)
    with np.errstate(all="ignore"):
        assert_same_bits(em.conv2d(x, w, model), oracle.conv2d(x, w, model))
        assert_same_bits(em.conv2d_backprop_input(dy, w, x.shape, model),
                         oracle.conv2d_backprop_input(dy, w, x.shape, model))
        assert_same_bits(em.conv2d_backprop_filter(x, dy, w.shape, model),
                         oracle.conv2d_backprop_filter(x, dy, w.shape, model))


FLOAT32_LANES = ["lanes(8, sequential:fp32, combine=pairwise:fp32)", "lanes(3, sequential:fp32, combine=sequential:fp32)",
                 "lanes(16, sequential:fp32, combine=pairwise:fp32:output=fp16)", "lanes(1, sequential:fp32, combine=pairwise:fp32)",
                 "lanes(5, sequential:fp32, combine=sequential:fp32, output=fp16)", "lanes(40, sequential:fp32, combine=pairwise:fp32)"]


@pytest.mark.parametrize("spec", FLOAT32_LANES)
def test_the_float32_lanes_kernel_equals_the_lanes_reduced_one_by_one(spec):
    """On float32 carriers (fp16 inputs) `_native_fp32.lanes_gemm` computes these models;
    on float64 ones each lane is the inner model's GEMM of a strided slice and the combine
    model reduces them: bit for bit the same, with rows across the kernel's 64-row tile, K
    below, at and above the width, signed zeros, fp16's largest values, inf and NaN."""
    model = em.parse_model(spec)
    assert model._float32_lanes(True) and not model._float32_lanes(False)
    rng = np.random.default_rng(11)
    for k in (1, 7, 8, 33, 300):
        scale = rng.choice([2.0**-12, 1.0, 2.0**12], size=(130, k))
        a = (rng.standard_normal((130, k)) * scale).astype(np.float16)
        w = rng.standard_normal((k, 5)).astype(np.float16)
        a[0], w[:, 0] = -0.0, 1.0  # (every product of row 0 with column 0 is -0)
        a[1, 0], a[2], a[3, -1] = np.inf, 65504.0, np.nan
        fast = np.empty((130, 5), np.float32)
        model.gemm_into(a.astype(np.float32), w.astype(np.float32), fast, 0, True)
        lane_by_lane = np.empty((130, 5))
        with np.errstate(invalid="ignore"):
            model.gemm_into(a.astype(np.float64), w.astype(np.float64), lane_by_lane, 0, True)
        assert_same_bits(fast.astype(np.float64), lane_by_lane)


@pytest.mark.parametrize("spec", FLOAT32_LANES[:3])
def test_float32_lanes_convolutions_match_the_oracle(spec):
    """81 output rows: across the lanes kernel's tile."""
    model = em.parse_model(spec)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 11, 11, 2)).astype(np.float16)
    w = rng.standard_normal((3, 3, 2, 2)).astype(np.float16)
    assert_same_bits(em.conv2d(x, w, model), oracle.conv2d(x, w, model))


@pytest.mark.parametrize("spec", ["lanes(8, exact:fp32, combine=sequential:fp32)",
                                  "lanes(8, sequential:fp16, combine=pairwise:fp32)"])
def test_lanes_wider_than_k_reduce_empty_lanes_to_zero(spec):
    """A 1x1 convolution over 3 channels: K = 3 terms in 8 lanes, five of them empty, which
    each inner model's kernel (float32 or float16 carriers) sums from +0 to +0."""
    model = em.parse_model(spec)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 9, 3)).astype(np.float16)
    w = rng.standard_normal((1, 1, 3, 4)).astype(np.float16)
    assert_same_bits(em.conv2d(x, w, model), oracle.conv2d(x, w, model))


FP16_RANGES = ["splitk(4, sequential:fp16, combine=fp32)", "splitk(1, sequential:fp16, combine=fp32)",
               "splitk(length=7, sequential:fp16:addition=fp32, combine=fp32)",
               "splitk(3, sequential:fp16, combine=fp32, output=fp16)", "splitk(length=64, sequential:fp16, combine=fp32)"]


@needs_f16c
@pytest.mark.parametrize("spec", FP16_RANGES)
def test_the_fp16_ranges_kernel_equals_the_ranges_reduced_one_by_one(spec):
    """On float32 carriers (fp16 inputs) `_native_fp16.chunked_gemm_fp32_total` computes
    these splits; on float64 ones each range is the inner model's GEMM and the partial
    results are summed in fp32: bit for bit the same, K below, at and above the parts,
    ranges that overflow fp16 (inf, and inf - inf), a NaN, and sums that stay finite only in fp32."""
    model = em.parse_model(spec)
    assert model._fp16_ranges_fp32_total(True) and not model._fp16_ranges_fp32_total(False)
    rng = np.random.default_rng(13)
    for k in (1, 3, 4, 9, 130):
        a = (rng.standard_normal((37, k)) * rng.choice([2.0**-12, 1.0, 2.0**6], size=(37, k))).astype(np.float16)
        w = rng.standard_normal((k, 6)).astype(np.float16)
        a[0], w[:, 0] = 300.0, 300.0  # (each range of row 0, column 0 overflows fp16: 90,000 a term)
        a[1, ::2], a[1, 1::2], a[2, -1] = 65504.0, -65504.0, np.nan
        a[3], w[:, 1] = 255.0, 255.0  # (65,025 a term: finite once ranges are 1 term long)
        fast = np.empty((37, 6), np.float32)
        with np.errstate(invalid="ignore"):
            model.gemm_into(a.astype(np.float32), w.astype(np.float32), fast, 0, True)
            range_by_range = np.empty((37, 6))
            model.gemm_into(a.astype(np.float64), w.astype(np.float64), range_by_range, 0, True)
        assert_same_bits(fast.astype(np.float64), range_by_range)


def test_split_k_combines_partials_in_the_combine_format():
    """Two halves of 2048 + 1 each: summed in fp16 the 1s are lost; in fp32 they are kept."""
    a = np.array([[2048.0, 1.0, 2048.0, 1.0]], np.float16)
    b = np.ones((1, 4), np.float16)
    assert float(em.dot(a, b, em.parse_model("splitk(2, exact:fp32, combine=fp16)"))[0]) == 4096.0
    assert float(em.dot(a, b, em.parse_model("splitk(2, exact:fp32, combine=fp32)"))[0]) == 4098.0
    assert em.parse_model("splitk(2, exact:fp32, combine=fp16)").output.name == "fp16"


def test_lanes_deal_terms_round_robin():
    """Lane 0 gets 2048 and 1 (fp16: 2048), lane 1 gets 1 and 1 (2): 2050, not 2051."""
    a = np.array([[2048.0, 1.0, 1.0, 1.0]], np.float16)
    model = em.parse_model("lanes(2, sequential:fp16, combine=sequential:fp32)")
    assert float(em.dot(a, np.ones((1, 4), np.float16), model)[0]) == 2050.0


@pytest.mark.parametrize("spec,message", [
    ("splitk(a100, combine=fp16)", "splitk needs exactly one of parts"),
    ("splitk(2, 3, a100)", "splitk takes splitk\\(PARTS | length=N, INNER"),
    ("splitk(0, a100)", "parts must be an integer >= 1; received 0"),
    ("splitk(2, a100, colour=red)", "splitk parameter must be one of"),
    ("splitk(2, a100", "splitk spec must end with"),
    ("splitk(2, lanes(2, a100, combine=exact:fp32)), combine=fp32)", "unbalanced parentheses"),
    ("lanes(4, sequential:fp16)", "lanes needs combine=MODEL"),
    ("lanes(4, sequential:fp16:rounding=sr, combine=sequential:fp32)", "cannot round stochastically"),
    ("reverse(4, a100)", "reverse takes reverse\\(INNER\\[, output=FORMAT\\]\\[, positions=nhw\\|hwn\\]\\[, zeros=signed\\|positive\\]\\)"),
    ("reverse(a100, combine=fp32)", "reverse parameter must be one of inner, output, positions, zeros; received 'combine'"),
    ("warp(4, a100)", "composite model must be one of splitk, lanes, reverse, columns, rows; received 'warp'"),
    ("lanes(2, sequential:fp16, combine=sequential:fp16, tail=-1)", "tail must be an integer >= 0; received -1"),
    ("lanes(2, sequential:fp16, combine=sequential:fp16, tail=x)", "tail must be an integer; received 'x'"),
    ("lanes(2, a100, combine=sequential:fp32, tail=1)", "inner must be a plain model \\(sequential, pairwise, chunked or "
     "exact\\) when tail is set; received inner=a100"),
    ("lanes(2, sequential:fp32:product=fp16, combine=sequential:fp32, tail=1)",
     "the inner model's product format must hold the combine's output \\(fp32\\) when tail is set; received product=fp16"),
    ("columns(sequential:fp16 * \u00b2)", "a columns repeat count must be a positive integer"),
    ("columns()", "columns needs at least one model"),
    ("columns(sequential:fp16 * 0)", "a columns repeat count must be a positive integer; received 'sequential:fp16 \\* 0'"),
    ("columns(sequential:fp16 * two)", "a columns repeat count must be a positive integer"),
    ("columns(sequential:fp16, sequential:fp32)", "columns' models must share one output format"),
    ("columns(sequential:fp16, output=fp32)", "columns' output is its models' own \\(fp16\\); set output on the models"),
    ("splitk(1, columns(sequential:fp16, sequential:fp16:product=fp16), combine=fp16)",
     "inner of a composite cannot be a columns model"),
    ("lanes(2, sequential:fp16, combine=columns(sequential:fp16))", "combine of a composite cannot be a columns model"),
    ("rows(sequential:fp16 * 0)", "a rows repeat count must be a positive integer; received 'sequential:fp16 \\* 0'"),
    ("rows()", "rows needs at least one model"),
    ("rows(rows(sequential:fp16))", "a rows model must be a plain or a columns model, not a rows model; received rows\\(sequential:fp16\\)"),
    ("columns(rows(sequential:fp16))", "a columns model of a composite cannot be a rows model"),
    ("splitk(2, rows(sequential:fp16, pairwise:fp16), combine=fp16)", "inner of a composite cannot be a rows model"),
    ("rows(columns(sequential:fp16, lanes(2, sequential:fp16:rounding=sr, combine=sequential:fp16)))",
     "inner of a composite cannot round stochastically"),
    ("rows(sequential:fp16, sequential:fp32)", "rows' models must share one output format"),
    ("splitk(length=4, sequential:fp16, first=, combine=fp16)", "splitk's first must be models separated by \\|"),
    ("splitk(length=4, sequential:fp16, first=sequential:fp16 || pairwise:fp16, combine=fp16)",
     "splitk's first must be models separated by \\|"),
    ("splitk(length=4, sequential:fp16, first=sequential:fp16:rounding=sr, combine=fp16)",
     "first of a composite cannot round stochastically"),
])
def test_bad_composite_specs_say_what_is_allowed(spec, message):
    with pytest.raises(InvalidArgument, match=message):
        em.parse_model(spec)


def test_reverse_sums_from_the_last_term():
    """2048, 1, 1 in fp16: forward each 1 ties back to 2048; reversed 1 + 1 = 2 first, then 2050."""
    a = np.array([[2048.0, 1.0, 1.0]], np.float16)
    b = np.ones((1, 3), np.float16)
    assert float(em.dot(a, b, em.parse_model("sequential:fp16"))[0]) == 2048.0
    assert float(em.dot(a, b, em.parse_model("reverse(sequential:fp16)"))[0]) == 2050.0
    assert em.parse_model("reverse(sequential:fp16, output=fp32)").to_spec() == "reverse(sequential:fp16, output=fp32)"


def test_split_k_with_a_model_combines_the_partials_as_that_model():
    """Four ranges 2048, 1, 1, 1 (fp32 inner): summed in order in fp16 each 1 ties back to 2048;
    pairwise, 1 + 1 meet first, and 2048 + 1 ties to even, then + 2 gives 2050."""
    a = np.array([[2048.0, 1.0, 1.0, 1.0]], np.float16)
    b = np.ones((1, 4), np.float16)
    assert float(em.dot(a, b, em.parse_model("splitk(4, sequential:fp32, combine=fp16)"))[0]) == 2048.0
    tree = em.parse_model("splitk(4, sequential:fp32, combine=pairwise:fp16)")
    assert float(em.dot(a, b, tree)[0]) == 2050.0
    assert tree.to_spec() == "splitk(4, sequential:fp32, combine=pairwise:fp16)"
    preset = em.parse_model("splitk(2, sequential:fp32, combine=v100)")  # a preset name is a model, not a format
    assert em.parse_model(preset.to_spec()) == preset


def test_the_first_ranges_take_their_own_models():
    """Ranges of 2 over 2048, 1, 1, 1, 1, 1, totalled in fp32: in fp16 the first range loses
    its 1 (2048, then 2 and 2: 2052); summed in fp32 it keeps 2049 (2053)."""
    a = np.array([[2048.0, 1.0, 1.0, 1.0, 1.0, 1.0]], np.float16)
    b = np.ones((1, 6), np.float16)
    plain = em.parse_model("splitk(length=2, sequential:fp16, combine=fp32)")
    first = em.parse_model("splitk(length=2, sequential:fp16, first=sequential:fp32, combine=fp32)")
    assert float(em.dot(a, b, plain)[0]) == 2052.0  # 2048 (1 lost), 2, 2
    assert float(em.dot(a, b, first)[0]) == 2053.0  # 2049 kept in fp32, 2, 2
    assert float(oracle.dot(a, b, first)[0]) == 2053.0
    assert first.range_model(0).to_spec() == "sequential:fp32" and first.range_model(5) == first.inner


def test_a_lanes_tail_is_added_after_the_combine():
    """Two fp16 lanes over 2048, 1 then -2048, 1: in its lane -2048 cancels 2048 (output 2);
    as the tail it meets 2048 + 1 already tied back to 2048 (output 1)."""
    a = np.array([[2048.0, 1.0, -2048.0, 1.0]], np.float16)
    b = np.ones_like(a)
    for tail, want in ((0, 2.0), (1, 2.0), (2, 1.0)):
        model = em.parse_model(f"lanes(2, sequential:fp16, combine=sequential:fp16, tail={tail})")
        assert float(em.dot(a, b, model)[0]) == float(oracle.dot(a, b, model)[0]) == want, tail


def test_a_columns_repeat_expands_and_runs_compress_back():
    """MODEL * N stands for N columns in a row; to_spec writes runs back that way."""
    model = em.parse_model("columns(sequential:fp16:product=fp16 * 3, sequential:fp16, sequential:fp16)")
    assert [m.to_spec() for m in model.models] == ["sequential:fp16:product=fp16"] * 3 + ["sequential:fp16"] * 2
    assert model.to_spec() == "columns(sequential:fp16:product=fp16 * 3, sequential:fp16 * 2)"
    assert em.parse_model(model.to_spec()) == model


def test_columns_give_each_output_channel_its_model_and_refuse_dot_products():
    """Channel 0 sums 2048 + 1 + 1 in fp16 (2048), channels 1 and 2 in fp32 rounded to fp16
    (2050); a dot product has no channel, so the model refuses it in one line."""
    model = em.parse_model("columns(sequential:fp16, sequential:fp32:output=fp16)")
    x = np.array([2048.0, 1.0, 1.0], np.float16).reshape(1, 1, 1, 3)
    w = np.ones((1, 1, 3, 3), np.float16)
    assert em.conv2d(x, w, model).ravel().tolist() == [2048.0, 2050.0, 2050.0]
    assert oracle.conv2d(x, w, model).ravel().tolist() == [2048.0, 2050.0, 2050.0]
    for dot in (em.dot, oracle.dot):
        with pytest.raises(InvalidArgument, match="differs by output channel"):
            dot(x.reshape(1, 3), np.ones((1, 3), np.float16), model)


def test_nested_first_models_round_trip_and_first_models_check_their_inputs():
    """A first= model with its own first= list parses back (the | inside its parentheses is
    its own); a block-FMA model in first= refuses inputs outside its input format as inner does."""
    spec = ("splitk(length=4, sequential:fp16, first=splitk(length=2, sequential:fp16, first=pairwise:fp16 | "
            "sequential:fp32:output=fp16, combine=fp16) | pairwise:fp16, combine=fp16)")
    model = em.parse_model(spec)
    assert model.to_spec() == spec and em.parse_model(model.to_spec()) == model and len(model.first) == 2
    fp8 = em.parse_model("splitk(2, sequential:fp32, first=blocked:fp32:b=4:in=fp8_e4m3, combine=fp32)")
    x = np.full((1, 1, 1, 4), 1.0 + 2.0**-9, np.float16)
    with pytest.raises(InvalidArgument, match="not fp8_e4m3 numbers"):
        em.conv2d(x, np.ones((1, 1, 4, 1), np.float16), fp8)
    with pytest.raises(InvalidArgument, match="positions must be one of nhw, hwn; received 'nwh'"):
        em.SplitK(inner=em.parse_model("sequential:fp16"), parts=2, positions="nwh")


def test_rows_give_each_gemm_row_its_model_and_refuse_dot_products():
    """Forward: output pixel 0 sums 2048 + 1 + 1 in fp16 (2048), pixel 1 in fp32 rounded to
    fp16 (2050); filter gradient: tap 0 (row 0) in fp16, tap 1 in fp32; nested columns pick by
    channel within a row; a dot product has no row."""
    model = em.parse_model("rows(sequential:fp16, sequential:fp32:output=fp16)")
    x = np.zeros((1, 1, 2, 3), np.float16)
    x[0, 0, :] = [2048.0, 1.0, 1.0]
    w = np.ones((1, 1, 3, 1), np.float16)
    for conv in (em.conv2d, oracle.conv2d):
        assert conv(x, w, model).ravel().tolist() == [2048.0, 2050.0]
    x2 = np.array([1.0, 2048.0, 1.0, 1.0], np.float16).reshape(1, 1, 4, 1)  # tap 0 reads 1, 2048, 1; tap 1 2048, 1, 1
    dy = np.ones((1, 1, 3, 1), np.float16)
    for grad in (em.conv2d_backprop_filter, oracle.conv2d_backprop_filter):
        assert grad(x2, dy, (1, 2, 1, 1), model).ravel().tolist() == [2048.0, 2050.0]
    nested = em.parse_model("rows(columns(sequential:fp16, sequential:fp32:output=fp16), sequential:fp32:output=fp16)")
    w2 = np.ones((1, 1, 3, 2), np.float16)
    for conv in (em.conv2d, oracle.conv2d):
        assert conv(x, w2, nested).ravel().tolist() == [2048.0, 2050.0, 2050.0, 2050.0]
    for dot in (em.dot, oracle.dot):
        with pytest.raises(InvalidArgument, match="differs by GEMM row"):
            dot(np.ones((1, 3), np.float16), np.ones((1, 3), np.float16), model)


def test_a_rows_repeat_expands_and_runs_compress_back():
    model = em.parse_model("rows(sequential:fp16 * 2, sequential:fp16, columns(pairwise:fp16 * 2, sequential:fp16))")
    assert len(model.models) == 4 and model.model_at(99) == model.models[3]
    assert model.to_spec() == "rows(sequential:fp16 * 3, columns(pairwise:fp16 * 2, sequential:fp16))"
    assert em.parse_model(model.to_spec()) == model
