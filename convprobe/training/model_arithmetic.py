"""`use_arithmetic`: any Keras model's convolutions under an arithmetic of your choice.

    with use_arithmetic(model, "v100:out=fp16") as record:
        model.fit(x, y)          # or train_on_batch, or a custom GradientTape loop

Inside the block every layer it can compute runs its forward pass and both gradients under
the arithmetic (`emulated_conv`, the op functions the ResNet's runs use), chosen per layer:
one arithmetic for all, or a mapping from layer name to arithmetic (the layers it does not
name keep TensorFlow's kernels). On exit the model is as it was: its layers' own
convolutions, its `jit_compile`, and train, test and predict functions rebuilt on next use.

What it computes today, in a layer that computes in float16 (`mixed_float16`): `Conv2D`
(strides, dilation, either padding; one group, channels_last) and `Dense` (its matmul and
both gradients through `emulated_dense`). Every other layer with a kernel (Conv1D, Conv3D,
DepthwiseConv2D, SeparableConv2D, Conv2DTranspose, EinsumDense, a grouped or channels_first
Conv2D, a layer computing in float32) is listed in the record with the reason, and runs
TensorFlow's kernel: never skipped without a word.
The twin (`"twin"`, TensorFlow's own kernels reproduced from an identify map) is not offered
here yet: `convprobe train` runs the twin of its ResNet.

The emulated ops are NumPy functions inside the graph (`tf.numpy_function`), which XLA
cannot compile: inside the block the model runs without `jit_compile` when any layer is
emulated (recorded), and a `tf.function` of your own traced before the block keeps the ops
it traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import keras
import tensorflow as tf

from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.training.arithmetic import (Arithmetic, ArithmeticKind, ConvOp, ConvShape, LayerArithmetic,
                                           OpArithmetic)
from convprobe.training.emulated_conv import emulated_convolution
from convprobe.training.emulated_dense import DenseOp, emulated_matmul

__all__ = ["use_arithmetic", "KERNEL_LAYER_KINDS"]

#: Layer kinds whose kernel does a reduction that an arithmetic could change: a layer of
#: these kinds that is not computed is listed with its reason.
KERNEL_LAYER_KINDS = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D", "SeparableConv1D",
                      "DepthwiseConv1D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "Dense",
                      "EinsumDense")

_NOT_YET = "convprobe does not emulate this layer kind yet; it runs TensorFlow's kernel"


def _reason(layer) -> str | None:
    """Why `layer` cannot be computed under an emulated arithmetic, or None when it can."""
    kind = type(layer).__name__
    if type(layer) is keras.layers.Dense:
        if getattr(layer, "quantization_mode", None) is not None:
            return f"a quantized Dense ({layer.quantization_mode}): {_NOT_YET}"
        if layer.compute_dtype != "float16":
            return (f"it computes in {layer.compute_dtype}: the emulated arithmetic takes fp16 operands "
                    f"(mixed_float16); it runs TensorFlow's kernel")
        return None
    if type(layer) is not keras.layers.Conv2D:
        return f"{kind}: {_NOT_YET}"
    if layer.groups != 1:
        return f"a grouped Conv2D (groups={layer.groups}): {_NOT_YET}"
    if layer.data_format != "channels_last":
        return f"a {layer.data_format} Conv2D: only channels_last (NHWC) is emulated; it runs TensorFlow's kernel"
    if layer.compute_dtype != "float16":
        return (f"it computes in {layer.compute_dtype}: the emulated arithmetic takes fp16 operands "
                f"(mixed_float16); it runs TensorFlow's kernel")
    return None


def _kernel_layers(model) -> list:
    """Every layer of `model` with a reduction over a kernel, nested models' included, in order."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if type(layer).__name__ in KERNEL_LAYER_KINDS or isinstance(layer, keras.layers.Conv2D)]


def _shape(layer) -> ConvShape:
    """A Conv2D's convolution as identify keys it, from the input shape it was built on (a
    subclassed model's layers have no symbolic input); the batch is 0 where it is not fixed."""
    batch, height, width, channels = layer.get_build_config()["input_shape"]
    return ConvShape((batch or 0, height, width, channels), tuple(layer.kernel.shape), tuple(layer.strides),
                     layer.padding.upper(), tuple(layer.dilation_rate))


def _per_layer(arithmetic, names: list[str]) -> dict[str, Arithmetic]:
    """The arithmetic of each named layer: one for all, or a mapping (native where it names none)."""
    if isinstance(arithmetic, Mapping):
        unknown = [name for name in arithmetic if name not in names]
        if unknown:
            raise invalid_choice("arithmetic names a layer", unknown[0], names)
        chosen = {name: _parse(text, f"arithmetic[{name!r}]") for name, text in arithmetic.items()}
        return {name: chosen.get(name, Arithmetic.parse(ArithmeticKind.NATIVE)) for name in names}
    parsed = _parse(arithmetic, "arithmetic")
    return {name: parsed for name in names}


def _parse(text, where: str) -> Arithmetic:
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"{where} must be native, or a model spec or GPU preset (e.g. v100:out=fp16, a100, "
                              f"sequential:fp16); received {text!r}")
    if text.strip() == ArithmeticKind.TWIN:
        raise InvalidArgument(f"{where} 'twin' is not offered for any Keras model yet (convprobe train runs the "
                              f"twin of its ResNet); give native, a model spec or a GPU preset")
    try:
        return Arithmetic.parse(text)
    except InvalidArgument as error:
        raise InvalidArgument(str(error).replace("--arithmetic", where, 1)) from None


@contextlib.contextmanager
def use_arithmetic(model: keras.Model, arithmetic: str | Mapping[str, str], *,
                   arithmetic_map: str | None = None) -> Iterator[dict]:
    """Compute `model`'s convolutions under `arithmetic` inside the block (module docstring).

    Args:
        model: a built Keras model (functional, Sequential or subclassed).
        arithmetic: ``"native"``, a model spec (``"sequential:fp16"``), a GPU preset
            (``"v100:out=fp16"``), or a mapping from layer name to one of those.
        arithmetic_map: reserved for the twin; must be None.

    Yields:
        The record of what runs: ``layers`` (each computed layer with its shape and, per op,
        its arithmetic and why), ``not_computed`` (each other layer with a kernel, and the
        reason), ``jit_compile`` (the model's, and the block's).
    """
    if not isinstance(model, keras.Model):
        raise InvalidArgument(f"model must be a Keras model; received {type(model).__name__}")
    if arithmetic_map is not None:
        raise InvalidArgument("arithmetic_map is read by the twin, which use_arithmetic does not offer yet; "
                              f"received arithmetic_map={arithmetic_map!r}")
    layers = _kernel_layers(model)
    if not model.built or any(not layer.built for layer in layers):
        raise InvalidArgument("model must be built before use_arithmetic (call it on a batch, or give it an Input): "
                              "each layer's shapes decide its convolution")
    reasons = {layer.name: _reason(layer) for layer in layers}
    computable = [layer for layer in layers if reasons[layer.name] is None]
    chosen = _per_layer(arithmetic, [layer.name for layer in layers])
    refused = [name for name, a in chosen.items() if a.emulated and reasons[name] is not None and
               isinstance(arithmetic, Mapping)]
    if refused:
        raise InvalidArgument(f"arithmetic names layer {refused[0]!r}, which use_arithmetic cannot compute: "
                              f"{reasons[refused[0]]}")
    emulated = [layer for layer in computable if chosen[layer.name].emulated]
    record = {
        "arithmetic": arithmetic if isinstance(arithmetic, str) else dict(arithmetic),
        "layers": [_layer_record(layer, chosen[layer.name], arithmetic) for layer in computable],
        "not_computed": [{"layer": layer.name, "kind": type(layer).__name__, "reason": reasons[layer.name]}
                         for layer in layers if reasons[layer.name] is not None],
        "jit_compile": {"model": model.jit_compile if model.compiled else None,
                        "inside": False if emulated else (model.jit_compile if model.compiled else None)},
    }
    previous_jit = model._jit_compile if model.compiled else None
    try:
        for layer in emulated:
            model_of = chosen[layer.name].model
            if isinstance(layer, keras.layers.Dense):
                assert model_of is not None, "an emulated arithmetic names its model"
                layer.call = _dense_call(layer, emulated_matmul(tf, model_of))
            else:
                layer.convolution_op = emulated_convolution(tf, _layer_arithmetic(layer, chosen[layer.name],
                                                                                  arithmetic))
        if emulated and model.compiled:
            model.jit_compile = False  # tf.numpy_function cannot be compiled by XLA
        _forget_functions(model)
        yield record
    finally:
        for layer in emulated:
            for name in ("convolution_op", "call"):
                layer.__dict__.pop(name, None)
        if model.compiled:
            model._jit_compile = previous_jit
        _forget_functions(model)


def _layer_arithmetic(layer, chosen: Arithmetic, given) -> LayerArithmetic:
    """What each of a Conv2D's three ops computes, and why."""
    source = _source(layer, chosen, given)
    return LayerArithmetic(layer.name, _shape(layer), {op: OpArithmetic(chosen.model, source) for op in ConvOp})


def _source(layer, chosen: Arithmetic, given) -> str:
    """Why a layer computes what it does: TensorFlow's kernel, or the argument that chose it."""
    if not chosen.emulated:
        return "native: TensorFlow's kernel"
    if isinstance(given, Mapping):
        return f"use_arithmetic arithmetic[{layer.name!r}] = {chosen.text!r}"
    return f"use_arithmetic arithmetic = {chosen.text!r}"


def _layer_record(layer, chosen: Arithmetic, given) -> dict:
    """A computed layer in the record: its kind, shapes and, per op, its arithmetic and why."""
    if isinstance(layer, keras.layers.Dense):
        cell = {"arithmetic": "tensorflow" if chosen.model is None else chosen.model.to_spec(),
                "source": _source(layer, chosen, given)}
        return {"kind": "Dense", "layer": layer.name,
                "input_shape": [d or 0 for d in layer.get_build_config()["input_shape"]],
                "kernel_shape": list(layer.kernel.shape), "ops": {str(op): dict(cell) for op in DenseOp}}
    return {"kind": "Conv2D", **_layer_arithmetic(layer, chosen, given).to_dict()}


def _dense_call(layer, matmul):
    """Dense's own call (Keras 3.15: matmul, bias, activation) with the matmul given."""
    def call(inputs, training=None):
        x = matmul(inputs, layer.kernel)
        if layer.bias is not None:
            x = keras.ops.add(x, layer.bias)
        if layer.activation is not None:
            x = layer.activation(x)
        return x
    return call


def _forget_functions(model) -> None:
    """Keras builds its train, test and predict functions once: drop them, so that the next
    call traces the layers as they are now."""
    for name in ("train_function", "test_function", "predict_function"):
        if hasattr(model, name):
            setattr(model, name, None)
