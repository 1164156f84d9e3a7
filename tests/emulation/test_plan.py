"""Kernel programs (`plan`) equal their references bit for bit: each model's `reduce_rows`
(the general kernel for the grammar's plain models, their composition for composites,
and a tree's float64 evaluation, each tested against the Fraction reference), on every
fp16 code point and on hypothesis-drawn models, trees and inputs."""

import numpy as np
import pytest
from numba import njit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convprobe import emulation as em
from convprobe.emulation import _native_fp16, plan
from convprobe.emulation._kernel_arithmetic import prefer_512_bit_vectors
from convprobe.emulation.plan import ADD32, FMA16, HALF, NotPlannable, Op
from convprobe.emulation.tree import Tree, leaves_of

from .conftest import assert_same_bits, fp16_arrays, needs_f16c, random_trees, signed_fp16

pytestmark = needs_f16c

#: One model per step kind and flag: fp16 steps exact (by TwoSum, and by the fp16 FMA onto
#: an fp16 value) and after an fp32 addition, fp32
#: steps, products rounded, register additions (pairwise), a total without the addition's
#: rounding (chunked), loads and lone roundings (trees), fp16 and fp32 outputs.
MODELS = [
    "sequential:fp16:product=fp16",
    "sequential:fp32:output=fp16",
    "sequential:fp16:addition=fp32:output=fp32",
    "chunked:fp16:n=3:addition=fp32:total=fp16",
    "chunked:fp32:n=2:product=fp16:total=fp16:output=fp32",
    "pairwise:fp16",
    "pairwise:fp32:product=fp16:output=fp16",
    "tree(((0)@fp16 1 (2 3)@fp32 {4 5}), accumulator=fp16, addition=fp32)",
    "tree(((0 1)@fp32 (2) 3 4..5), accumulator=fp16, product=fp16, output=fp32)",
    "splitk(length=4, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
    "splitk(2, pairwise:fp32, combine=chunked:fp16:n=1:product=fp16:total=fp16)",
    "lanes(4, sequential:fp32, combine=pairwise:fp16:addition=fp32, tail=3, output=fp16)",
    "lanes(3, chunked:fp16:n=2, combine=sequential:fp32:product=fp16)",
    "reverse(sequential:fp16:addition=fp32)",
    "lanes(2, sequential:fp16, combine=pairwise:fp16)",
]


def planned(model, a, w, fp16_fma: bool) -> np.ndarray:
    """The model's GEMM of a (M, K) against w (K, N) through its program (which its
    `gemm_into` takes on fp16 inputs), as float64."""
    assert model.carrier(True) == np.float32, model.to_spec()
    out = np.empty((a.shape[0], w.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        plan.run(model.program(a.shape[1]), a.astype(np.float32), w.astype(np.float32), out, 0, fp16_fma=fp16_fma)
    return out.astype(np.float64)


def reference(model, a, w) -> np.ndarray:
    """The same GEMM by the model's reference, `reduce_rows` over every (row, column) pair."""
    m, n = a.shape[0], w.shape[1]
    rows = np.repeat(a.astype(np.float64), n, axis=0)
    columns = np.tile(w.astype(np.float64).T, (m, 1))
    with np.errstate(all="ignore"):
        return np.asarray(model.reduce_rows(rows, columns, None), np.float64).reshape(m, n)


@pytest.fixture(params=[True, False], ids=["fp16 FMA", "float32 only"])
def fp16_fma(request) -> bool:
    """Both kernels of a program: the one that runs `FMA16` steps on the CPU's fp16 FMA
    (where it has AVX512-FP16) and the one in float32 lanes alone."""
    if request.param and not _native_fp16.available():
        pytest.skip("this CPU has no fp16 FMA (AVX512-FP16)")
    return request.param


@pytest.mark.parametrize("columns", [3, 8, 20])  # one block of channels, part of one; two blocks
@pytest.mark.parametrize("spec", MODELS)
def test_every_fp16_code_point_through_each_step(spec, columns, fp16_fma):
    """All 65,536 fp16 code points (inf and NaN included) as the first product's operand,
    beside signed terms of spread exponents, subnormals and ties, against columns of
    operands that keep it, halve it into subnormals and tie it."""
    model = em.parse_model(spec)
    k = 6
    rng = np.random.default_rng(3)
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    a = signed_fp16(rng, (codes.size + 69, k))  # (a last, partial tile of rows)
    a[:codes.size, 0] = codes
    w = signed_fp16(rng, (k, 20))
    w[0, :8] = np.float16([1, -1, 1.5, 2.0 ** -10, 3 * 2.0 ** -12, 2.0 ** 10, -0.75, 2.0 ** -24])
    w = w[:, [0, 3, 4, 1, 2, 5, 6, 7, *range(8, 20)][:columns]]
    got, want = planned(model, a, w, fp16_fma), reference(model, a, w)
    assert_same_bits(got, want)
    assert np.isnan(got).any() and np.isinf(got).any()  # the code points reach the results


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.sampled_from(MODELS), k=st.integers(0, 40), data=st.data())
def test_models_equal_their_reference(spec, k, data, fp16_fma):
    model = em.parse_model(spec)
    if spec.startswith("tree("):
        k = model.k
    a = data.draw(fp16_arrays((5, k)))
    w = data.draw(fp16_arrays((k, 3)))
    assert_same_bits(planned(model, a, w, fp16_fma), reference(model, a, w))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(root=random_trees(), seed=st.integers(0, 2**32 - 1),
       formats=st.sampled_from([dict(accumulator="fp16"), dict(accumulator="fp32", output="fp16"),
                                dict(accumulator="fp16", addition="fp32", product="fp16")]))
def test_random_trees_equal_their_evaluation(root, seed, formats, fp16_fma):
    """Trees whose nodes are all fp16 or fp32 and fused over at most two items run as
    programs; the others say they cannot."""
    model = Tree(root=root, **formats)
    rng = np.random.default_rng(seed)
    k = len(leaves_of(root))
    a, w = signed_fp16(rng, (9, k)), signed_fp16(rng, (k, 4))
    if not model.plannable():
        assert model.carrier(True) == np.float64
        with pytest.raises(NotPlannable):
            model.program(k)
        return
    assert_same_bits(planned(model, a, w, fp16_fma), reference(model, a, w))


def test_pairwise_program_keeps_registers_to_the_tree_depth():
    program = em.parse_model("pairwise:fp16").program(1000)
    assert program.registers <= 10  # ceil(log2(1000)) levels
    assert (program.steps[:, 0] == Op.LOAD).sum() + (program.steps[:, 0] == Op.ADD_LEAF).sum() == 1000


def test_fp16_fma_steps_are_those_onto_an_fp16_value():
    """Each lane of sequential fp16 starts from +0, so each of its exact steps adds a
    product to an fp16 value (`FMA16`); pairwise fp16 adds a product to a product first (22
    bits: TwoSum's step), then fp16 values to each other (`ADD32`)."""
    lanes = em.parse_model("lanes(2, sequential:fp16, combine=pairwise:fp16)").program(10).steps
    assert (lanes[lanes[:, 0] == Op.ADD_LEAF, 3] & FMA16 != 0).sum() == 10
    assert not (lanes[lanes[:, 0] != Op.ADD_LEAF, 3] & FMA16).any()
    pairwise = em.parse_model("pairwise:fp16").program(10).steps
    assert not (pairwise[:, 3] & FMA16).any()
    assert (pairwise[pairwise[:, 0] == Op.ADD, 3] & ADD32 != 0).all()


def test_the_fp16_fma_kernel_runs_the_marked_steps():
    """A control: a program that marks an fp16 step onto a register holding a 22-bit product
    (not an fp16 value) as `FMA16` gives other bits on the fp16 FMA's kernel (which rounds
    the register to fp16 first) than on the float32 kernel (which ignores the mark), so the
    FMA kernel does run the marked steps, and the planner must mark only fp16 registers."""
    if not _native_fp16.available():
        pytest.skip("this CPU has no fp16 FMA (AVX512-FP16)")
    rng = np.random.default_rng(29)
    a, w = signed_fp16(rng, (500, 2)), signed_fp16(rng, (2, 3))
    marked = plan.Program(np.array([[Op.LOAD, 0, 0, 0], [Op.ADD_LEAF, 0, 1, HALF | FMA16]], np.int64), 1)
    outs = {}
    for fma in (True, False):
        outs[fma] = np.empty((500, 3), np.float32)
        plan.run(marked, a.astype(np.float32), w.astype(np.float32), outs[fma], 0, fp16_fma=fma)
    assert (outs[True] != outs[False]).any()


def test_dot_and_gemm_into_take_the_program(monkeypatch):
    """`dot` on fp16 rows and a model's `gemm_into` on fp16 values run the model's program
    (each call seen on its way to the kernel), with the reference's bits."""
    model = em.parse_model("lanes(2, sequential:fp16, combine=pairwise:fp16)")
    calls = []
    for name in ("run", "run_rows"):
        original = getattr(plan, name)
        monkeypatch.setattr(plan, name, lambda *args, _f=original, _n=name, **kw: calls.append(_n) or _f(*args, **kw))
    rng = np.random.default_rng(31)
    a, b, w = signed_fp16(rng, (70, 9)), signed_fp16(rng, (70, 9)), signed_fp16(rng, (9, 5))
    out = np.empty((70, 5), np.float32)
    with np.errstate(all="ignore"):
        rows = em.dot(a, b, model).astype(np.float64)
        model.gemm_into(a.astype(np.float32), w.astype(np.float32), out, 0, True)
        want_rows = np.asarray(model.reduce_rows(a.astype(np.float64), b.astype(np.float64), None), np.float64)
    assert calls == ["run_rows", "run"]
    assert_same_bits(rows, want_rows)
    assert_same_bits(out.astype(np.float64), reference(model, a, w))


@pytest.mark.parametrize("spec", ["sequential:bf16", "pairwise:fp16:subnormals=flush",
                                  "chunked:fp16:n=4:rounding=toward_zero:total=fp16", "sequential:fp16:overflow=saturate",
                                  "tree(((0 1)@bf16 2), accumulator=fp16)", "tree({0 1 2}, accumulator=fp16)",
                                  "splitk(2, sequential:bf16, combine=fp32)", "lanes(2, exact:fp32, combine=sequential:fp32)",
                                  "columns(sequential:fp16 * 2, sequential:fp32:output=fp16)"])
def test_models_a_program_cannot_express_keep_their_kernels(spec):
    model = em.parse_model(spec)
    assert not model.plannable()
    with pytest.raises(NotPlannable):
        model.program(model.k if spec.startswith("tree(") else 3)


@pytest.mark.parametrize("spec", MODELS)
def test_dot_runs_the_program_on_every_fp16_code_point(spec, fp16_fma):
    """`dot` on fp16 operands takes the program row by row (pair tiles, `plan.run_rows`):
    the same bits as the model's reduce_rows, all 65,536 code points in the first product."""
    model = em.parse_model(spec)
    k = model.k if spec.startswith("tree(") else 6
    rng = np.random.default_rng(5)
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    a, b = signed_fp16(rng, (codes.size, k)), signed_fp16(rng, (codes.size, k))
    a[:, 0] = codes
    with np.errstate(all="ignore"):
        got = plan.run_rows(model.program(k), a, b, fp16_fma=fp16_fma)
        want = np.asarray(model.reduce_rows(a.astype(np.float64), b.astype(np.float64), None), np.float64)
    assert_same_bits(got.astype(np.float64), want)


def test_a_kernel_asks_llvm_for_512_bit_vectors():
    """`prefer_512_bit_vectors` puts clang's -mprefer-vector-width=512 attribute on the
    calling function (llvmlite writes it as a string attribute: a change there shows here)."""

    @njit
    def kernel(x):
        prefer_512_bit_vectors()
        return x + 1

    assert kernel(1) == 2
    assert any('"prefer-vector-width"="512"' in ir for ir in kernel.inspect_llvm().values())
