"""The tree model: its text, its agreement with the grammar's models it can spell, and the
fast evaluation against the exact Fraction reference on every fp16 code point and on
random trees."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convprobe.emulation import conv2d, dot, parse_model, tree_reference
from convprobe.emulation.tree import Tree, leaves_of, parse_tree, tree_text
from convprobe.errors import InvalidArgument

from .conftest import assert_same_bits, random_trees, signed_fp16

K = 29
#: Grammar models and the tree spec that spells the same arithmetic over K terms.
SPELLED = [
    ("sequential:fp16", f"tree(((0) 1..{K - 1}), accumulator=fp16)"),
    ("sequential:fp16:addition=fp32", f"tree(((0) 1..{K - 1}), accumulator=fp16, addition=fp32)"),
    ("sequential:fp16:product=fp16", f"tree((0..{K - 1}), accumulator=fp16, product=fp16)"),
    ("sequential:fp32:output=fp16", f"tree((0..{K - 1}), accumulator=fp32, output=fp16)"),
    ("reverse(sequential:fp16)", f"tree((({K - 1}) {K - 2}..0), accumulator=fp16)"),
    ("exact:fp64:output=fp16", f"tree({{0..{K - 1}}}, accumulator=fp64, output=fp16)"),
    ("splitk(length=10, sequential:fp32, combine=fp16, output=fp16)",
     "tree((((0..9))@fp16 (10..19) (20..28))@fp16, accumulator=fp32, output=fp16)"),
    ("lanes(2, sequential:fp32, combine=sequential:fp32, output=fp16)",
     "tree((0..28/2 (1..27/2)), accumulator=fp32, output=fp16)"),
]


@pytest.mark.parametrize("grammar, spec", SPELLED)
def test_tree_spells_the_grammar_model_bit_for_bit(grammar, spec):
    rng = np.random.default_rng(1)
    a, b = signed_fp16(rng, (400, K)), signed_fp16(rng, (400, K))
    assert_same_bits(dot(a, b, parse_model(spec)), dot(a, b, parse_model(grammar)))
    x, w = signed_fp16(rng, (2, 5, 5, K)), signed_fp16(rng, (1, 1, K, 3))
    assert_same_bits(conv2d(x, w, parse_model(spec)), conv2d(x, w, parse_model(grammar)))


def test_text_reads_back():
    root = parse_tree("((0 1)@fp32 {2 3 4} 9..5 10..20/2 11..21/2)")
    assert tree_text(root) == "((0 1)@fp32 {2..4} 9..5 10..20/2 11..21/2)"
    assert parse_tree(tree_text(root)) == root
    model = parse_model("tree(((0) 1..4), accumulator=fp16, product=fp16, addition=fp32, output=fp32)")
    assert parse_model(model.to_spec()) == model
    assert model.k == 5


@pytest.mark.parametrize("text, message", [
    ("(0 1 1)", "repeated [1]"),
    ("(0 2)", "missing [1]"),
    ("(0 1", "unbalanced"),
    ("(0 1))", "unbalanced"),
    ("0 1", "inside a node"),
    ("(0 1)@fp99", "fp99"),
    ("(0 x)", "unexpected character"),
    ("()", "at least one item"),
])
def test_bad_text_is_one_clear_error(text, message):
    with pytest.raises(InvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_model(f"tree({text}, accumulator=fp16)")


def test_a_tree_refuses_another_k():
    with pytest.raises(InvalidArgument, match="sums 3 products; the reduction has K = 4"):
        dot(np.ones(4, np.float16), np.ones(4, np.float16), parse_model("tree((0..2), accumulator=fp16)"))


#: Every node kind and a per-chain format, over 5 leaves: the code point sits at leaf 0.
EVERY_NODE = "((0 1)@fp32 {2 3} (4))"


@pytest.mark.parametrize("formats", [
    dict(accumulator="fp16"),
    pytest.param(dict(accumulator="fp16", addition="fp32"), marks=pytest.mark.slow),
    pytest.param(dict(accumulator="fp16", product="fp16", output="fp32"), marks=pytest.mark.slow),
    dict(accumulator="fp32", output="fp16"),
])
def test_every_fp16_code_point_against_the_fraction_reference(formats):
    """All 65,536 fp16 code points at leaf 0, times operands that make ties and subnormals,
    next to terms that cancel, straddle the node formats and overflow."""
    model = Tree(root=EVERY_NODE, **formats)
    codes = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    rng = np.random.default_rng(7)
    a = np.empty((codes.size, 5), np.float16)
    a[:, 0] = codes
    a[:, 1:] = signed_fp16(rng, (codes.size, 4))
    b = signed_fp16(rng, (codes.size, 5))
    b[:, 0] = rng.choice(np.array([1, -1, 1.5, 2.0 ** -10, 3 * 2.0 ** -12, 2.0 ** 10], np.float16), codes.size)
    fast = dot(a, b, model)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    slow = np.array([tree_reference.reduce(a64[r].tolist(), b64[r].tolist(), model) for r in range(codes.size)])
    assert_same_bits(fast, slow.astype(fast.dtype))


@settings(max_examples=60, deadline=None)
@given(root=random_trees(), seed=st.integers(0, 2**32 - 1),
       formats=st.sampled_from([dict(accumulator="fp16"), dict(accumulator="fp32", output="fp16"),
                                dict(accumulator="fp16", addition="fp32", product="fp16"),
                                dict(accumulator="bf16", output="fp32")]))
def test_random_trees_agree_with_the_fraction_reference(root, seed, formats):
    model = Tree(root=root, **formats)
    rng = np.random.default_rng(seed)
    k = len(leaves_of(root))
    a, b = signed_fp16(rng, (20, k)), signed_fp16(rng, (20, k))
    fast = dot(a, b, model).astype(np.float64)
    slow = np.array([tree_reference.reduce(a[r].astype(np.float64).tolist(), b[r].astype(np.float64).tolist(), model)
                     for r in range(20)])
    worst = np.flatnonzero((fast != slow) & ~(np.isnan(fast) & np.isnan(slow)))
    assert worst.size == 0, (f"{model.to_spec()}: row {worst[0]} fast {fast[worst[0]]!r} reference "
                             f"{slow[worst[0]]!r} (a {a[worst[0]]}, b {b[worst[0]]})")
