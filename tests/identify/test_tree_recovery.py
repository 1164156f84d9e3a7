"""Tree recovery from crafted sums: the black boxes are the emulator's own models (the
arithmetic they run is known exactly), random trees, and boxes that are not one tree."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convprobe.emulation import dot, parse_model
from convprobe.emulation.tree import Chain, Fused, Item, Tree, tree_text
from convprobe.identify.tree_formats import measure_formats, tree_models
from convprobe.identify.tree_recovery import NotRecovered, predicted, recover


def _box(model):
    """The model's sum of each row of fp16 terms, as a kernel computes it."""
    return lambda rows: model.reduce_rows(rows, np.ones_like(rows), None).astype(np.float64)


def _scaled_box(model):
    """As `layer_patterns` asks an op: operands rows / scale in fp16, times the constant scale."""
    def sums(rows, scale=1.0):
        operands = (rows / scale).astype(np.float16).astype(np.float64)
        return model.reduce_rows(operands, np.full_like(operands, np.float16(scale)), None).astype(np.float64)
    return sums


def _shape(item: Item):
    """A tree up to commutativity: a fold is nested pairs, a fused node a set."""
    if isinstance(item, int):
        return item
    children = [_shape(i) for i in item.items]
    if isinstance(item, Fused):
        return ("fused", frozenset(children), item.format)
    if len(children) == 1:
        return ("alone", children[0], item.format)
    acc = children[0]
    for nxt in children[1:]:
        acc = ("+", frozenset([acc, nxt]), item.format)
    return acc


def _signed(rng, shape):
    values = rng.standard_normal(shape) * np.exp2(rng.integers(-14, 6, shape))
    coarse = rng.random(shape) < 0.15
    values[coarse] = rng.integers(-64, 64, shape)[coarse] / 2
    return values.astype(np.float16)


#: Models of CPU kernels seen so far, and others no kernel here has: each must come back
#: as a tree that, in the formats measured through the same box, is the model bit for bit.
MODELS = [
    ("sequential:fp16", 40),
    ("sequential:fp16:addition=fp32", 33),
    ("sequential:fp32:output=fp16", 100),
    ("sequential:fp16:product=fp16", 25),
    ("pairwise:fp32:output=fp16", 37),
    ("lanes(8, sequential:fp32, combine=pairwise:fp32, output=fp16)", 100),
    ("lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, tail=3)", 47),
    ("splitk(length=30, sequential:fp16, combine=fp16)", 100),
    ("splitk(length=264, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)", 513),
    ("reverse(sequential:fp16)", 20),
    ("chunked:fp16:n=16:total=fp16:addition=fp32", 70),
    ("chunked:fp32:n=7:total=fp16:output=fp16", 50),
    ("splitk(length=12, sequential:fp32, combine=fp16, output=fp16)", 40),
    ("splitk(length=10, sequential:fp16:addition=fp32, combine=fp32, output=fp16)", 35),
    ("lanes(4, sequential:fp16, combine=pairwise:fp32, output=fp16)", 30),
    # two fp16 lanes summed in fp32, then a scalar tail that rounds each product first
    ("tree(((((0)@fp16 2 4) ((1)@fp16 3 5))@fp32 (6)@fp16 (7)@fp16 (8)@fp16), accumulator=fp16, addition=fp32)", 9),
    # PyTorch's CPU filter gradient without oneDNN: per sample, a vector tree and a vector tail
    # summed in fp32 and stored to the fp16 result; the next sample's sum added to it in fp32,
    # then stored (a step whose items are partial sums, rounded twice: fp32, then fp16)
    ("tree((((((0 2) (1 3)) ((4 6) (5 7)) (8 9)))@fp16 (((10 12) (11 13)) ((14 16) (15 17)) (18 19))), "
     "accumulator=fp32, output=fp16)", 20),
]


@pytest.mark.parametrize("spec, k", MODELS)
def test_recovered_tree_in_measured_formats_is_the_model(spec, k):
    _assert_recovered_as_the_model(spec, k, rows=3000)


def _assert_recovered_as_the_model(spec: str, k: int, rows: int) -> None:
    """The tree recovered from `spec`'s box, in its measured formats, is one candidate that
    matches the model on `rows` signed rows."""
    model = parse_model(spec)
    root, asked = recover(_box(model), k)
    assert asked > 0
    formats = measure_formats(_scaled_box(model), root, k)
    candidates = tree_models(root, formats)
    rng = np.random.default_rng(3)
    a, b = _signed(rng, (rows, k)), _signed(rng, (rows, k))
    expected = dot(a, b, model).view(np.uint16)
    matched = [np.mean(dot(a, b, c).view(np.uint16) == expected) for c in candidates]
    assert max(matched) == 1.0, (f"{spec}: recovered {tree_text(root)} with {formats}; best candidate "
                                 f"{candidates[int(np.argmax(matched))].to_spec()} matches {max(matched):.2%}")
    assert len(candidates) == 1, [c.to_spec() for c in candidates]  # the formats were measured, not guessed


@pytest.mark.parametrize("spec", [
    "tree((((0 1 6)@fp32 ((2 3)@fp16 4)@fp32)@fp16 5 7), accumulator=fp16, output=fp16)",
    "tree((((0 1 6)@fp32 ((2)@fp16 3 4)@fp32)@fp16 5 7), accumulator=fp16, output=fp16)"])
def test_a_step_is_not_read_through_a_sum_rounded_to_fp16_on_the_way(spec):
    """The fp16 step that adds ((2 3)@fp16 4): its test value 1 - 2**-20 at leaf 2 arrives
    as 1 (rounded in the nested fp16 sum, or alone), which would read as an fp32 step. The
    difference shows in about 1 sum in 16,000, so many rows."""
    _assert_recovered_as_the_model(spec, 8, rows=400_000)


def test_a_grammar_tree_comes_back_as_written():
    assert tree_text(recover(_box(parse_model("lanes(4, sequential:fp32, combine=pairwise:fp32)")), 16)[0]) == \
        "(0..12/4 (1..13/4) (2..14/4 (3..15/4)))"
    assert tree_text(recover(_box(parse_model("splitk(length=5, sequential:fp32, combine=fp32)")), 12)[0]) == \
        "(0..4 (5..9) (10 11))"


def test_fused_nodes_of_a_tensor_core_come_back():
    """v100 adds 4 products and the accumulator in one fused, truncating step."""
    root, _ = recover(_box(parse_model("v100:out=fp16")), 16)
    assert _shape(root) == _shape(Fused((Fused((Fused((Fused((0, 1, 2, 3)), 4, 5, 6, 7)), 8, 9, 10, 11)),
                                                12, 13, 14, 15)))


@st.composite
def _binary_trees(draw, max_leaves=40):
    """A random tree of binary folds over shuffled leaves (what a CPU kernel may do)."""
    k = draw(st.integers(2, max_leaves))
    leaves = list(draw(st.permutations(list(range(k)))))

    def build(items):
        if len(items) == 1:
            return items[0]
        cut = draw(st.integers(1, len(items) - 1))
        return Chain((build(items[:cut]), build(items[cut:])))

    return build(leaves), k


@settings(max_examples=40, deadline=None)
@given(case=_binary_trees(), accumulator=st.sampled_from(["fp16", "fp32"]))
def test_any_binary_tree_comes_back(case, accumulator):
    root, k = case
    model = Tree(accumulator, output="fp16", root=root)
    got, _ = recover(_box(model), k)
    assert _shape(got) == _shape(root), f"{tree_text(root)} came back as {tree_text(got)}"


def test_an_exact_sum_is_not_a_tree():
    with pytest.raises(NotRecovered, match="exact multi-term sum or an accumulator wider than fp32"):
        recover(_box(parse_model("exact:fp64:output=fp16")), 20)


def test_an_order_that_depends_on_the_values_is_not_a_tree():
    """A kernel that adds its terms largest first (an order set by the data, not the
    position) answers the crafted sums, but no one tree predicts them."""
    def by_magnitude(rows):
        order = np.argsort(-np.abs(rows), axis=1, kind="stable")
        ordered = np.take_along_axis(rows, order, axis=1)
        return parse_model("sequential:fp32").reduce_rows(ordered, np.ones_like(ordered), None)

    with pytest.raises(NotRecovered, match="mispredicts|survive"):
        recover(by_magnitude, 24)


def test_a_sum_that_is_not_the_unit_or_zero_is_reported():
    with pytest.raises(NotRecovered, match="neither the unit nor 0"):
        recover(lambda rows: rows.sum(axis=1) + 1.0, 8)


def test_predicted_answers_follow_the_tree():
    chain = Chain(tuple(range(6)))
    assert predicted(chain, [(0, 1, 5), (0, 5, 1), (4, 5, 0)]) == [True, False, False]
    fused = Fused((0, 1, 2))
    assert predicted(fused, [(0, 1, 2)]) == [False]  # a truncating adder loses the unit beside M


def test_formats_are_measured_per_chain():
    """fp32 chunks summed into an fp16 total: the chunks' chains keep fp32, the total's is fp16."""
    model = parse_model("chunked:fp32:n=8:total=fp16:output=fp16")
    root, _ = recover(_box(model), 32)
    formats = measure_formats(_scaled_box(model), root, 32)
    assert {f for chain in formats.chains for f in chain.kept} - {None} == {"fp16", "fp32"}, formats
    assert formats.products_rounded is False
