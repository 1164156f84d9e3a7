"""Training under a chosen arithmetic: which model each conv op runs, and that the layer
computes exactly what the emulator (or TensorFlow's own kernel) computes, forward and
both gradients, on signed inputs with spread exponents."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.errors import InvalidArgument
from convprobe.training.arithmetic import Arithmetic, ArithmeticKind, ConvOp, ConvShape, twin_layers
from convprobe.training.config import validate_config

SHAPE = ConvShape((2, 7, 7, 5), (3, 3, 5, 6), (2, 2), "SAME", (1, 1))


def test_arithmetic_names_parse_into_kinds_and_canonical_specs():
    assert Arithmetic.parse("native").kind is ArithmeticKind.NATIVE
    assert Arithmetic.parse("twin").kind is ArithmeticKind.TWIN
    v100 = Arithmetic.parse(" v100:out=fp16 ")
    assert (v100.kind, v100.text, v100.model.to_spec()) == (ArithmeticKind.SPEC, "v100:out=fp16", "v100:out=fp16")
    with pytest.raises(InvalidArgument, match="--arithmetic must be native, twin, or a model spec"):
        Arithmetic.parse("fp9")


def test_a_gpu_preset_is_recognised_by_the_model_not_its_spec_text():
    """The header's GPU scope note belongs to a preset's tensor-core model, not to an explicit
    blocked spec or a model whose text happens to start like one."""
    assert Arithmetic.parse("v100:out=fp16").gpu_preset and Arithmetic.parse("a100").gpu_preset
    assert not Arithmetic.parse(Arithmetic.parse("a100").model.explicit_spec()).gpu_preset
    assert not any(Arithmetic.parse(text).gpu_preset for text in ("sequential:fp16", "native", "twin"))


def test_a_counterfactual_runs_one_model_for_every_op_and_native_runs_none():
    spec = Arithmetic.parse("a100").layers({"conv": SHAPE})["conv"]
    assert {op: a.label for op, a in spec.ops.items()} == {op: "a100" for op in ConvOp}
    native = Arithmetic.parse("native").layers({"conv": SHAPE})["conv"]
    assert not native.emulated and {a.label for a in native.ops.values()} == {"tensorflow"}


def test_an_emulated_arithmetic_chooses_no_jit_and_refuses_what_it_cannot_run():
    assert validate_config(arithmetic="sequential:fp16").jit is False
    assert validate_config().jit is True
    assert validate_config(configuration="onednn-off").jit is False
    assert validate_config(configuration="jit").jit is True
    for kwargs, message in (
        (dict(arithmetic="a100", jit=True), "which XLA cannot compile"),
        (dict(arithmetic="a100", dtype="bf16"), "applies to --dtype fp16"),
        (dict(arithmetic="a100", distribute="mirrored"), "runs in one process on one device"),
        (dict(configuration="jit", jit=False), "--config jit runs with XLA"),
        (dict(configuration="onednn-off", jit=True), "--config onednn-off runs without XLA"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            validate_config(**kwargs)


OTHER = ConvShape((2, 7, 7, 5), (1, 1, 5, 6), (1, 1), "SAME", (1, 1))


def _document(perfect_forward: list[str], shape: ConvShape = SHAPE, best_forward: str | None = None) -> dict:
    """An identify map of two layers in the 'default' configuration (the fields twin reads)."""
    label = "tensorflow/cpu/default"
    forward_best = best_forward or (perfect_forward or ["sequential:fp32:output=fp16"])[0]
    summaries = {
        "conv2d": {"best": forward_best, "fractions": {"45": 1.0 if perfect_forward else 0.97},
                   "stops_matching_at": None, "perfect": perfect_forward},
        "conv2d_backprop_input": {"best": "sequential:fp16", "fractions": {"54": 1.0}, "stops_matching_at": None,
                                  "perfect": ["sequential:fp16"]},
        "conv2d_backprop_filter": {"best": "pairwise:fp16", "fractions": {"32": 1.0}, "stops_matching_at": None,
                                   "perfect": ["pairwise:fp16"]},
    }
    cells = {f"{name} / {op}": {"summary": summary} for name in ("layer_a", "layer_b")
             for op, summary in summaries.items()}
    layers = [{"layer": {**shape.to_dict(), "name": "layer_a"}, "ops": {}},
              {"layer": {**OTHER.to_dict(), "name": "layer_b"}, "ops": {}}]
    return {"results": [{"config": {"name": "default", "label": label}, "status": "ok",
                         "observed": {"layers": layers}}],
            "matches": {label: cells}}


def test_the_twin_takes_identifys_exact_models_and_says_where_it_keeps_tensorflows_kernel():
    layers = twin_layers(_document([]), {"conv1": SHAPE, "conv2": SHAPE}, "default")
    conv1 = layers["conv1"]
    assert conv1.ops[ConvOp.FORWARD].model is None
    assert "found no model that matches every output (closest sequential:fp32:output=fp16: 97.0%)" in \
        conv1.ops[ConvOp.FORWARD].source
    assert conv1.ops[ConvOp.INPUT_GRADIENT].label == "sequential:fp16"
    assert conv1.ops[ConvOp.FILTER_GRADIENT].label == "pairwise:fp16"
    exact = twin_layers(_document(["chunked:fp16:n=16"]), {"conv1": SHAPE}, "default")["conv1"]
    assert exact.ops[ConvOp.FORWARD].label == "chunked:fp16:n=16"
    # identify reports another of the perfect specs (the recovered tree's): the twin takes that one
    chosen = twin_layers(_document(["chunked:fp16:n=16", "sequential:fp16"], best_forward="sequential:fp16"),
                         {"conv1": SHAPE}, "default")["conv1"]
    assert chosen.ops[ConvOp.FORWARD].label == "sequential:fp16"


def test_a_cell_identify_did_not_report_is_refused_not_taken_for_no_model():
    document = _document(["sequential:fp16"])
    del document["matches"]["tensorflow/cpu/default"]["layer_a / conv2d_backprop_filter"]
    with pytest.raises(InvalidArgument, match="no result for 'layer_a / conv2d_backprop_filter'"):
        twin_layers(document, {"conv1": SHAPE}, "default")


def test_the_twin_refuses_a_map_of_other_shapes_or_configurations():
    with pytest.raises(InvalidArgument, match="no results for configuration 'onednn-off'; its configurations "
                                              "are default \\(measure one with identify --configs onednn-off\\)"):
        twin_layers(_document([]), {"conv1": SHAPE}, "onednn-off")
    unnamed = _document([])
    del unnamed["results"][0]["config"]["name"]  # an emulator's row: no TensorFlow configuration
    with pytest.raises(InvalidArgument, match="'default'; it holds no TensorFlow configuration"):
        twin_layers(unnamed, {"conv1": SHAPE}, "default")
    other_batch = replace(SHAPE, input_shape=(4, 7, 7, 5))
    with pytest.raises(InvalidArgument) as info:
        twin_layers(_document([]), {"conv1": other_batch}, "default")
    assert str(info.value) == (
        "the identify map did not measure layer conv1 (input (4, 7, 7, 5) * filter (3, 3, 5, 6), strides (2, 2)) in "
        "configuration 'default'; the map has this filter at input (2, 7, 7, 5): it was measured at another batch "
        "or image size (1 of 1 layers missing; it measured (2, 7, 7, 5) * (1, 1, 5, 6), (2, 7, 7, 5) * (3, 3, 5, 6)): "
        "measure this run's own "
        "layers")
    wider = replace(SHAPE, input_shape=(2, 7, 7, 8), filter_shape=(3, 3, 8, 6))
    with pytest.raises(InvalidArgument, match="the map has no layer with this filter and strides: it was measured "
                                              "on another model \\(depth or width\\)"):
        twin_layers(_document([]), {"conv1": wider}, "default")


def _signed(rng: np.random.Generator, shape) -> np.ndarray:
    """Signed fp16 values over several binades, some subnormal, some exact ties of a sum."""
    values = rng.choice([-1.0, 1.0], size=shape) * np.exp2(rng.integers(-16, 3, size=shape)) * \
        (1 + rng.integers(0, 1024, size=shape) / 1024)
    return values.astype(np.float16)


@pytest.mark.tensorflow
@pytest.mark.parametrize("spec", ["sequential:fp16", "v100:out=fp16", None])
def test_the_layer_computes_the_emulators_ops_or_tensorflows_own_bit_for_bit(spec):
    from convprobe.training import runtime
    from convprobe.training.arithmetic import LayerArithmetic, OpArithmetic
    from convprobe.training.emulated_conv import emulated_convolution

    tf = runtime.tensorflow()
    rng = np.random.default_rng(7)
    x, w = _signed(rng, SHAPE.input_shape), _signed(rng, SHAPE.filter_shape)
    dy = _signed(rng, (2, 4, 4, 6))
    model = None if spec is None else Arithmetic.parse(spec).model
    layer = LayerArithmetic("conv", SHAPE, {op: OpArithmetic(model, "test") for op in ConvOp})
    convolution = emulated_convolution(tf, layer)
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = convolution(xt, wt)
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
    if spec is None:  # TensorFlow's own conv and its registered gradient
        with tf.GradientTape() as tape:
            tape.watch([xt, wt])
            y_ref = tf.nn.conv2d(xt, wt, strides=2, padding="SAME")
        want = [y_ref, *tape.gradient(y_ref, [xt, wt], output_gradients=tf.constant(dy))]
    else:
        emulator = EmulatedBackend(model)
        args = dict(strides=(2, 2), padding="SAME", dilation=(1, 1))
        want = [emulator.conv2d(x, w, **args), emulator.conv2d_backprop_input(dy, w, SHAPE.input_shape, **args),
                emulator.conv2d_backprop_filter(x, dy, SHAPE.filter_shape, **args)]
    for name, got, expected in zip(("forward", "input gradient", "filter gradient"), (y, dx, dw), want):
        got, expected = np.asarray(got).astype(np.float16), np.asarray(expected).astype(np.float16)
        differ = np.flatnonzero(got.view(np.uint16) != expected.view(np.uint16))
        assert differ.size == 0, (f"{spec} {name}: {differ.size} of {got.size} differ, first at "
                                  f"{differ[:3]}: {got.ravel()[differ[:3]]} vs {expected.ravel()[differ[:3]]}")
