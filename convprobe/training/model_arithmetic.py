"""`use_arithmetic`: any Keras model's convolutions under an arithmetic of your choice.

    with use_arithmetic(model, "v100:out=fp16") as record:
        model.fit(x, y)          # or train_on_batch, or a custom GradientTape loop

Inside the block every layer it can compute runs its forward pass and both gradients under
the arithmetic (`emulated_conv`, the op functions the ResNet's runs use), chosen per layer:
one arithmetic for all, or a mapping from layer name to arithmetic (the layers it does not
name keep TensorFlow's kernels). On exit the model is as it was: its layers' own
convolutions, its `jit_compile`, and train, test and predict functions rebuilt on next use.

What it computes today, in a layer that computes in float16 (`mixed_float16`): `Conv2D`
(strides, dilation, either padding, groups; channels_last), `Conv1D` (the same, causal
padding too; computed as the 2-D convolution of height 1 that TensorFlow runs it as) and
`Dense` (its matmul and both gradients through `emulated_dense`). Every other layer with a
kernel (Conv3D,
DepthwiseConv2D, SeparableConv2D, Conv2DTranspose, EinsumDense, a channels_first conv, a
layer computing in float32) is listed in the record with the reason, and runs
TensorFlow's kernel: never skipped without a word.
The twin (`"twin"`, TensorFlow's own kernels reproduced from an identify map) is not offered
here yet: `convprobe train` runs the twin of its ResNet.

The emulated ops are NumPy functions inside the graph (`tf.numpy_function`), which XLA
cannot compile: inside the block the model and every model inside it run without
`jit_compile` when any layer is emulated (recorded; compile the model before the block),
and a `tf.function` of your own traced before the block keeps the ops it traced. A layer
shared with another model is rerouted there too. A Conv2D is computed at the input shape
it was built on (a model built on unknown heights or widths is refused), and a Dense
layer's product forms rows x units x K partial products: meant for the layers of
small models and probes, not for a large network's full training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import keras
import tensorflow as tf

from convprobe import emulation as em
from convprobe.errors import InvalidArgument
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
    if type(layer) not in (keras.layers.Conv2D, keras.layers.Conv1D):
        return f"{kind}: {_NOT_YET}"
    if layer.data_format != "channels_last":
        return f"a {layer.data_format} {kind}: only channels_last is emulated; it runs TensorFlow's kernel"
    if layer.compute_dtype != "float16":
        return (f"it computes in {layer.compute_dtype}: the emulated arithmetic takes fp16 operands "
                f"(mixed_float16); it runs TensorFlow's kernel")
    return None


def _kernel_layers(model) -> list:
    """Every layer of `model` with a kernel (a reduction an arithmetic could change: convs,
    Dense, recurrent cells, ...), nested models' included, in order."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)
            if not isinstance(layer, keras.Model) and (type(layer).__name__ in KERNEL_LAYER_KINDS
                                                       or _has_kernel(layer))]


def _has_kernel(layer) -> bool:
    try:
        return getattr(layer, "kernel", None) is not None
    except (AttributeError, ValueError):  # a kernel property of a layer not built
        return False


def _models(model) -> list:
    """`model` and every model inside it: each has its own train, test and predict functions."""
    return [m for m in model._flatten_layers(include_self=True, recursive=True) if isinstance(m, keras.Model)]


def _shape(layer) -> ConvShape:
    """A conv layer's convolution as identify keys it, from the input shape it was built on (a
    subclassed model's layers have no symbolic input); the batch is 0 where it is not fixed.
    A Conv1D is the 2-D convolution TensorFlow runs it as: a height of 1, its causal padding
    applied before (as Keras does) and VALID after."""
    if isinstance(layer, keras.layers.Conv1D):
        batch, length, channels = layer.get_build_config()["input_shape"]
        if length is None:
            raise InvalidArgument(f"layer {layer.name!r} was built on inputs of unknown length; use_arithmetic "
                                  f"computes a Conv1D at the shape it was built on: build the model on a fixed "
                                  f"input shape")
        causal = layer.padding == "causal"
        extra = layer.dilation_rate[0] * (layer.kernel_size[0] - 1) if causal else 0
        return ConvShape((batch or 0, 1, length + extra, channels), (1, *layer.kernel.shape), (1, layer.strides[0]),
                         "VALID" if causal else layer.padding.upper(), (1, layer.dilation_rate[0]))
    batch, height, width, channels = layer.get_build_config()["input_shape"]
    if height is None or width is None:
        raise InvalidArgument(f"layer {layer.name!r} was built on inputs of unknown height or width ({height} x "
                              f"{width}); use_arithmetic computes a Conv2D at the shape it was built on: build the "
                              f"model on a fixed input shape")
    return ConvShape((batch or 0, height, width, channels), tuple(layer.kernel.shape), tuple(layer.strides),
                     layer.padding.upper(), tuple(layer.dilation_rate))


def _per_layer(arithmetic, layers: list) -> dict[int, Arithmetic]:
    """The arithmetic of each layer (keyed by identity: names may repeat across nested models):
    one for all, or a mapping by name (native where it names none)."""
    if not isinstance(arithmetic, Mapping):
        parsed = _parse(arithmetic, "arithmetic")
        return {id(layer): parsed for layer in layers}
    names = [layer.name for layer in layers]
    for name in arithmetic:
        if name not in names:
            raise InvalidArgument(f"arithmetic names layer {name!r}, which the model does not have; its layers with "
                                  f"a kernel are {', '.join(names)}")
        if names.count(name) > 1:
            raise InvalidArgument(f"arithmetic names layer {name!r}, and {names.count(name)} layers of the model "
                                  f"(in nested models) have that name: give it one arithmetic for all")
    chosen = {name: _parse(text, f"arithmetic[{name!r}]") for name, text in arithmetic.items()}
    return {id(layer): chosen.get(layer.name, Arithmetic.parse(ArithmeticKind.NATIVE)) for layer in layers}


def _parse(text, where: str) -> Arithmetic:
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"{where} must be native, or a model spec or GPU preset (e.g. v100:out=fp16, a100, "
                              f"sequential:fp16); received {text!r}")
    if text.strip() == ArithmeticKind.TWIN:
        raise InvalidArgument(f"{where} 'twin' is not offered for any Keras model yet (convprobe train runs the "
                              f"twin of its ResNet); give native, a model spec or a GPU preset")
    try:
        return Arithmetic.parse(text)
    except InvalidArgument:
        try:
            em.parse_model(text.strip())
        except InvalidArgument as error:
            raise InvalidArgument(f"{where} must be native, or a model spec or GPU preset (e.g. v100:out=fp16, "
                                  f"a100, sequential:fp16); received {text!r} ({error})") from None
        raise


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
    busy = [layer.name for layer in layers if _PATCHED & set(layer.__dict__)]
    if busy:
        raise InvalidArgument(f"layer {busy[0]!r} is inside another use_arithmetic block already; one block at a "
                              f"time (a mapping gives each layer its own arithmetic)")
    reasons = {id(layer): _reason(layer) for layer in layers}
    chosen = _per_layer(arithmetic, layers)
    if isinstance(arithmetic, Mapping):
        refused = [layer for layer in layers if chosen[id(layer)].emulated and reasons[id(layer)] is not None]
        if refused:
            raise InvalidArgument(f"arithmetic names layer {refused[0].name!r}, which use_arithmetic cannot "
                                  f"compute: {reasons[id(refused[0])]}")
    computable = [layer for layer in layers if reasons[id(layer)] is None]
    emulated = [layer for layer in computable if chosen[id(layer)].emulated]
    patches = {id(layer): _patch(layer, chosen[id(layer)], arithmetic) for layer in emulated}  # shapes checked
    models = _models(model)
    jit = {id(m): (m._jit_compile if m.compiled else None) for m in models}
    record = {
        "arithmetic": arithmetic if isinstance(arithmetic, str) else dict(arithmetic),
        "layers": [_layer_record(layer, chosen[id(layer)], arithmetic) for layer in computable],
        "not_computed": [{"layer": layer.name, "kind": type(layer).__name__, "reason": reasons[id(layer)]}
                         for layer in layers if reasons[id(layer)] is not None],
        "jit_compile": {"model": model.jit_compile if model.compiled else None,
                        "inside": False if emulated else (model.jit_compile if model.compiled else None)},
    }
    try:
        for layer in emulated:
            name, function = patches[id(layer)]
            setattr(layer, name, function)
        for m in models:
            if emulated and m.compiled:
                m.jit_compile = False  # tf.numpy_function cannot be compiled by XLA
            _forget_functions(m)
        yield record
    finally:
        for layer in emulated:
            for name in _PATCHED:
                layer.__dict__.pop(name, None)
        for m in models:
            if m.compiled and jit[id(m)] is not None:
                m._jit_compile = jit[id(m)]
            _forget_functions(m)


#: The instance attributes `use_arithmetic` sets on a layer it reroutes (and removes on exit).
_PATCHED = {"convolution_op", "call"}


def _patch(layer, chosen: Arithmetic, given) -> tuple[str, object]:
    """The attribute that reroutes `layer`, and its new value."""
    if isinstance(layer, keras.layers.Dense):
        assert chosen.model is not None, "an emulated arithmetic names its model"
        return "call", _dense_call(layer, emulated_matmul(tf, chosen.model))
    convolution = emulated_convolution(tf, _layer_arithmetic(layer, chosen, given))
    if isinstance(layer, keras.layers.Conv1D):
        return "call", _conv1d_call(layer, convolution)
    return "convolution_op", convolution


def _conv1d_call(layer, convolution):
    """Conv1D's own call (Keras 3.15: causal padding, conv, bias, activation) with its
    convolution computed as a 2-D one of height 1, as TensorFlow computes it."""
    def call(inputs):
        if layer.padding == "causal":
            inputs = keras.ops.pad(inputs, layer._compute_causal_padding())
        outputs = tf.squeeze(convolution(tf.expand_dims(inputs, 1), tf.expand_dims(layer.kernel, 0)), 1)
        if layer.use_bias:
            outputs = keras.ops.add(outputs, keras.ops.reshape(layer.bias, (1, 1, layer.filters)))
        return outputs if layer.activation is None else layer.activation(outputs)
    return call


def _layer_arithmetic(layer, chosen: Arithmetic, given) -> LayerArithmetic:
    """What each of a conv layer's three ops computes, and why."""
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
    return {"kind": type(layer).__name__, **_layer_arithmetic(layer, chosen, given).to_dict()}


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
