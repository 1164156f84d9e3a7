"""`dot` of a matrix product (a's rows against b's rows, a's axes first) takes the
convolutions' GEMM kernels (`conv.gemm`): the same bits as the model's own reduction of
every (row, row) pair, on every fp16 code point, on hypothesis-drawn shapes, and against
the Fraction oracle."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convprobe import emulation as em
from convprobe.emulation import oracle
from convprobe.errors import InvalidArgument

from .conftest import assert_same_bits, signed_fp16

#: Plain, chunked, pairwise, composite, tree, stochastic, wide and block-FMA models: each
#: GEMM kernel family the convolutions use.
MODELS = [
    "sequential:fp16",
    "sequential:fp32:output=fp16",
    "chunked:fp16:n=3:addition=fp32:total=fp16",
    "pairwise:fp16",
    "splitk(length=4, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
    "lanes:fp16:w=8:then=pairwise",
    "tree(((0)@fp16 1 (2 3)@fp32 {4 5}), accumulator=fp16, addition=fp32)",
    "sequential:fp16:rounding=stochastic:seed=7",
    "sequential:bf16",
    "exact:fp64",
    "v100",
    "a100:out=fp16",
]
K = 6


def _rows_reference(a: np.ndarray, b: np.ndarray, model) -> np.ndarray:
    """The same dot with every pair written out as its own row: `dot`'s row path."""
    lead = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    full = [np.ascontiguousarray(np.broadcast_to(x, (*lead, x.shape[-1]))) for x in (a, b)]
    return em.dot(*full, model)


@pytest.mark.parametrize("codes_in", ["a", "b"])
@pytest.mark.parametrize("spec", MODELS)
def test_a_matrix_product_on_every_fp16_code_point_equals_its_rows(spec, codes_in):
    """All 65,536 code points (infinities and NaNs included) as the first term of a's rows
    or of b's rows, against signed operands with spread exponents, subnormals and ties."""
    model = em.parse_model(spec)
    rng = np.random.default_rng(11)
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    many, few = signed_fp16(rng, (codes.size, K)), signed_fp16(rng, (4, K))
    many[:, 0] = codes
    a, b = (many[:, None, :], few) if codes_in == "a" else (few[:, None, :], many)
    with np.errstate(all="ignore"):
        got = em.dot(a, b, model)
        want = _rows_reference(a, b, model)
    assert_same_bits(got, want)


@pytest.mark.parametrize("spec", ["sequential:fp16", "pairwise:fp32:output=fp16", "v100",
                                  "sequential:fp16:rounding=stochastic:seed=3"])
def test_a_matrix_product_equals_the_fraction_oracle(spec):
    model = em.parse_model(spec)
    rng = np.random.default_rng(2)
    a, b = signed_fp16(rng, (5, 1, 9)), signed_fp16(rng, (4, 9))
    with np.errstate(all="ignore"):
        assert_same_bits(em.dot(a, b, model), np.asarray(oracle.dot(a, b, model)).astype(em.dot(a, b, model).dtype))


@settings(max_examples=40, deadline=None)
@given(spec=st.sampled_from(MODELS), a_lead=st.lists(st.integers(1, 6), max_size=3),
       b_lead=st.lists(st.integers(1, 6), max_size=3), k=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_any_broadcast_of_rows_against_rows_equals_its_rows(spec, a_lead, b_lead, k, seed):
    """a (*A, 1, ..., 1, K) against b (*B, K): whatever the split, the GEMM and the rows agree."""
    model = em.parse_model(spec)
    if spec.startswith("tree("):
        k = model.k
    rng = np.random.default_rng(seed)
    a = signed_fp16(rng, (*a_lead, *(1,) * len(b_lead), k))
    b = signed_fp16(rng, (*b_lead, k))
    with np.errstate(all="ignore"):
        assert_same_bits(em.dot(a, b, model), _rows_reference(a, b, model))


@pytest.mark.parametrize("spec", ["columns(sequential:fp16, sequential:fp32:output=fp16)",
                                  "rows(sequential:fp16, sequential:fp32:output=fp16)"])
def test_a_model_that_picks_by_output_place_still_refuses_a_matrix_product(spec):
    """A 1x1 convolution would compute it, but `dot` (and its oracle) has no output channel."""
    a, b = np.ones((8, 1, 3), np.float16), np.ones((8, 3), np.float16)
    with pytest.raises(InvalidArgument, match="differs by"):
        em.dot(a, b, em.parse_model(spec))
