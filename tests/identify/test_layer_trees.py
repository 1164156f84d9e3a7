"""Trees recovered at a conv layer's own ops, through the emulator as the backend (its
arithmetic is known exactly): the classes of cells, and the composed model reproducing
the op bit for bit on signed inputs."""

import numpy as np
import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.emulation import parse_model
from convprobe.identify.layer_trees import _signature_classes, recover_at_layer, tree_specs
from convprobe.probes.layers import Layer, op_confirmation_inputs, run_op
from convprobe.identify.structure import Structure

#: Rows 0-3 and the rest differ; within the first rows, columns 0-2 and the rest.
KERNEL = ("rows(columns(lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16) * 3, "
          "sequential:fp16:addition=fp32) * 4, chunked:fp32:n=16:total=fp16:output=fp16)")


def _reproduces(spec: str, backend, layer: Layer, op: str) -> float:
    x, w = op_confirmation_inputs(layer, op, 11)
    with np.errstate(over="ignore", invalid="ignore"):
        want = run_op(backend, layer, op, x, w)
        got = run_op(EmulatedBackend(spec), layer, op, x, w)
    return float(np.mean(want.view(np.uint16) == got.view(np.uint16)))


def test_cells_are_classed_by_row_and_column():
    layer = Layer(input_shape=(1, 3, 3, 37), filter_shape=(1, 1, 37, 5))
    trees = recover_at_layer(EmulatedBackend(KERNEL), layer, "conv2d")
    assert not trees.note and len(trees.classes) == 3
    (first, labels), (second, rest) = trees.layout
    assert (first, second) == (0, 4)
    assert labels[:3] == (labels[0],) * 3 and labels[3:] == (labels[3],) * 2 and labels[0] != labels[3]
    assert set(rest) == {rest[0]} and rest[0] not in labels


@pytest.mark.parametrize("op", ["conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"])
def test_composed_tree_model_reproduces_each_op(op):
    layer = Layer(input_shape=(2, 5, 5, 7), filter_shape=(3, 3, 7, 6), padding="SAME")
    backend = EmulatedBackend(KERNEL)
    trees = recover_at_layer(backend, layer, op)
    assert not trees.note, trees.note
    specs = tree_specs(layer, op, trees, Structure(), lambda spec, cells: 0.0)
    assert specs and _reproduces(specs[0], backend, layer, op) == 1.0, specs[0]
    parse_model(specs[0])  # the document's spec reads back


@pytest.mark.parametrize("spec", ["pairwise:fp16", KERNEL])
@pytest.mark.parametrize("layer", [
    Layer(input_shape=(1, 6, 6, 4), filter_shape=(3, 3, 4, 5), strides=(2, 2), padding="SAME"),
    Layer(input_shape=(2, 9, 8, 3), filter_shape=(3, 2, 3, 6), strides=(2, 1), padding="SAME"),
    Layer(input_shape=(1, 12, 12, 4), filter_shape=(4, 4, 4, 9), strides=(4, 4), padding="VALID"),
], ids=lambda layer: layer.label)
def test_a_strided_input_gradient_is_recovered_phase_by_phase(spec, layer):
    """Each dx pixel of a strided input gradient reads one phase of the taps (the rest meet
    dy's inserted zeros): its rows are grouped by phase, each phase's tree is recovered over
    its own taps and completed with the zeros, and the composed model reproduces the op."""
    op = "conv2d_backprop_input"
    backend = EmulatedBackend(spec)
    trees = recover_at_layer(backend, layer, op)
    assert not trees.note and trees.classes, trees.note
    specs = tree_specs(layer, op, trees, Structure(), lambda spec, cells: 0.0)
    assert _reproduces(specs[0], backend, layer, op) == 1.0, specs[0]


def test_an_exact_kernel_is_not_a_tree_and_says_so():
    layer = Layer(input_shape=(1, 3, 3, 9), filter_shape=(1, 1, 9, 4))
    trees = recover_at_layer(EmulatedBackend("exact:fp64:output=fp16"), layer, "conv2d")
    assert "exact multi-term sum" in trees.note


#: Columns 0-2 round their products, column 3 does not; every 8-term chunk is stored to
#: fp16 before the chunks are added, which rounds any sum that crosses a chunk whatever
#: the products were (strict XLA's input gradient: the column past the last vector of 16).
_PRODUCTS_BY_COLUMN = ("columns(splitk(length=8, sequential:fp32:product=fp16:output=fp16, combine=fp16) * 3, "
                       "splitk(length=8, sequential:fp32:output=fp16, combine=fp16))")
_MANY_CHUNKS = Layer(input_shape=(1, 2, 2, 1024), filter_shape=(1, 1, 1024, 4))


def test_cells_that_differ_only_in_how_they_round_products_are_classed_apart():
    """Random terms mostly meet across a stored chunk; neighbouring ones show the products."""
    classes = _signature_classes(EmulatedBackend(_PRODUCTS_BY_COLUMN), _MANY_CHUNKS, "conv2d", 0)
    assert sorted(sorted({column for _, column in c.cells}) for c in classes) == [[0, 1, 2], [3]]


def test_cells_that_differ_only_in_how_they_round_products_are_reproduced():
    """Each chunk's fp16 store is read where the chunk joins the sum of the chunks before
    it, and the model stores the chunk there."""
    backend = EmulatedBackend(_PRODUCTS_BY_COLUMN)
    trees = recover_at_layer(backend, _MANY_CHUNKS, "conv2d")
    assert not trees.note, trees.note
    assert [labels for _, labels in trees.layout] == [(0, 0, 0, 1)], trees.layout
    specs = tree_specs(_MANY_CHUNKS, "conv2d", trees, Structure(), lambda spec, cells: 0.0)
    assert _reproduces(specs[0], backend, _MANY_CHUNKS, "conv2d") == 1.0, specs[0]
