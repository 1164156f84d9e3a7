"""`use_arithmetic`: any Keras model's convolutions and matmuls under an arithmetic of your choice.

    with use_arithmetic(model, "v100:out=fp16") as record:
        model.fit(x, y)          # or train_on_batch, or a custom GradientTape loop

Inside the block every layer it can compute runs its forward pass and both gradients under
the arithmetic (`emulated_conv`, `emulated_dense`: the op functions the ResNet's runs use),
chosen per layer: one arithmetic for all, or a mapping from layer name to arithmetic (the
layers it does not name keep TensorFlow's kernels). An arithmetic is ``native``, a model
spec or GPU preset, or ``twin``: per op, the model an identify map measured in this
process's TensorFlow configuration (TensorFlow's own kernel where identify found none),
so that a twin step must reproduce TensorFlow's own bit for bit. On exit the model is as
it was: its layers' own calls, its `jit_compile`, and train, test and predict functions
rebuilt on next use.

What it computes, in a layer that computes in float16 (`mixed_float16`), channels_last:
`Conv2D` (strides, dilation, either padding, groups), `Conv1D` (causal too: the 2-D
convolution of height 1 TensorFlow runs it as), `DepthwiseConv2D` (any depth multiplier)
and both halves of `SeparableConv2D` without dilation, `Conv2DTranspose` (the conv2d it
transposes, roles swapped), `Dense` (its matmul and both gradients) and an `EinsumDense`
whose equation is that matmul. Every other layer with a kernel (Conv3D, another
EinsumDense, a channels_first conv, a layer computing in float32, ...) is listed in the
record with the reason, and runs TensorFlow's kernel: never skipped without a word. The method and the limits are in the guide.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from convprobe.errors import InvalidArgument
from convprobe.training.arithmetic import (Arithmetic, ArithmeticKind, ConvOp, ConvShape, LayerArithmetic,
                                           OpArithmetic, OpFamily, TwinMap, read_identify_map)
from convprobe.training.bias_fusion import BiasPlacement, bias_placement, fused_value, with_value
from convprobe.training.emulated_conv import emulated_convolution
from convprobe.training.emulated_dense import emulated_matmul
from convprobe.training.runtime import configuration_in_effect

__all__ = ["use_arithmetic", "KERNEL_LAYER_KINDS"]

#: Layer kinds whose kernel does a reduction that an arithmetic could change: a layer of
#: these kinds (or any other with a kernel) that is not computed is listed with its reason.
KERNEL_LAYER_KINDS = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D", "SeparableConv1D",
                      "DepthwiseConv1D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "Dense",
                      "EinsumDense")
#: The kinds `use_arithmetic` computes.
COMPUTED = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D,
            keras.layers.Conv2DTranspose, keras.layers.Dense, keras.layers.EinsumDense)
#: The layers whose op is a matmul over the input's last axis (an EinsumDense where its equation says so).
_MATMULS = (keras.layers.Dense, keras.layers.EinsumDense)

_NOT_YET = "convprobe does not emulate this layer kind yet; it runs TensorFlow's kernel"
_KERNEL = "it runs TensorFlow's kernel"


def _reason(layer) -> str | None:
    """Why `layer` cannot be computed under an emulated arithmetic, or None when it can."""
    kind = type(layer).__name__
    if type(layer) not in COMPUTED:
        return f"{kind}: {_NOT_YET}"
    if isinstance(layer, _MATMULS):
        if getattr(layer, "quantization_mode", None) is not None:
            return f"a quantized {kind} ({layer.quantization_mode}): {_NOT_YET}"
        if isinstance(layer, keras.layers.EinsumDense) and not _matmul_equation(layer.equation):
            return (f"an EinsumDense of equation {layer.equation!r}, not a matmul over the input's last axis "
                    f"('...k,kn->...n'): {_NOT_YET}")
    elif layer.data_format != "channels_last":
        return f"a {layer.data_format} {kind}: only channels_last is emulated; {_KERNEL}"
    if layer.compute_dtype != "float16":
        return f"it computes in {layer.compute_dtype}: the emulated arithmetic takes fp16 operands (mixed_float16); {_KERNEL}"
    dilated = max(getattr(layer, "dilation_rate", (1,))) > 1
    if dilated and isinstance(layer, (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D,
                                      keras.layers.Conv2DTranspose)):
        return f"a dilated {kind} (TensorFlow runs it through space-to-batch): {_NOT_YET}"
    if isinstance(layer, keras.layers.Conv2DTranspose) and layer.output_padding is not None:
        return f"a Conv2DTranspose with output_padding: {_NOT_YET}"
    return None


def _matmul_equation(equation: str) -> bool:
    """Whether an einsum equation is a matmul over its input's last axis: 'ab,bc->ac',
    'abc,cd->abd' (no ellipsis, no other reduced or broadcast axis)."""
    inputs, _, output = equation.replace(" ", "").partition("->")
    x, _, w = inputs.partition(",")
    return (bool(x) and len(w) == 2 and x[-1] == w[0] and output == x[:-1] + w[1] and "." not in equation
            and len(set(x + w[1])) == len(x) + 1)


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


@dataclass(frozen=True)
class _Part:
    """One set of three ops a layer runs (a SeparableConv2D runs two): its name in the record,
    its op family and its shape as identify keys it (batch 0 where it is not fixed)."""

    name: str
    family: OpFamily
    shape: ConvShape


def _built_shape(layer, batch: int | None) -> tuple:
    """The input shape `layer` was built on, its batch the model's fixed one where it has none."""
    shape = tuple(layer.get_build_config()["input_shape"])
    if any(size is None for size in shape[1:]):
        raise InvalidArgument(f"layer {layer.name!r} was built on inputs of unknown size {shape}; use_arithmetic "
                              f"computes a layer at the shape it was built on: build the model on a fixed input shape")
    return (shape[0] or batch or 0, *shape[1:])


def _parts(layer, batch: int | None) -> list[_Part]:
    """The ops `layer` runs, as identify measures them (`probes.layers` keys the same shapes)."""
    shape = _built_shape(layer, batch)
    if isinstance(layer, _MATMULS):
        rows, units = shape[0] * math.prod(shape[1:-1]), int(layer.kernel.shape[-1])
        return [_Part(layer.name, OpFamily.MATMUL, ConvShape((rows, 1, 1, shape[-1]), (1, 1, shape[-1], units),
                                                             (1, 1), "VALID", (1, 1)))]
    if isinstance(layer, keras.layers.Conv1D):  # the conv2d of height 1, causal padding applied before
        n, length, channels = shape
        causal = layer.padding == "causal"
        extra = layer.dilation_rate[0] * (layer.kernel_size[0] - 1) if causal else 0
        return [_Part(layer.name, OpFamily.CONV2D, ConvShape(
            (n, 1, length + extra, channels), (1, *layer.kernel.shape), (1, layer.strides[0]),
            "VALID" if causal else layer.padding.upper(), (1, layer.dilation_rate[0])))]
    strides, padding, dilation = tuple(layer.strides), layer.padding.upper(), tuple(layer.dilation_rate)
    if isinstance(layer, keras.layers.Conv2DTranspose):  # the conv2d it transposes: its input is the layer's output
        n, h, w, c = shape
        out_h, out_w = (int(size) for size in layer.compute_output_shape(shape)[1:3])
        conv = ConvShape((n, out_h, out_w, layer.filters), tuple(layer.kernel.shape), strides, padding, dilation)
        back = _conv_output(conv)
        if back != (h, w):
            raise InvalidArgument(f"layer {layer.name!r}: the conv2d it transposes maps {out_h}x{out_w} to {back[0]}x"
                                  f"{back[1]}, not the layer's input {h}x{w}")
        return [_Part(layer.name, OpFamily.CONV2D, conv)]
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        return [_Part(layer.name, OpFamily.DEPTHWISE, ConvShape(shape, tuple(layer.kernel.shape), strides, padding,
                                                                dilation))]
    if isinstance(layer, keras.layers.SeparableConv2D):
        depthwise = ConvShape(shape, tuple(layer.depthwise_kernel.shape), strides, padding, dilation)
        channels = shape[3] * layer.depth_multiplier
        pointwise = ConvShape((shape[0], *_conv_output(depthwise), channels), tuple(layer.pointwise_kernel.shape),
                              (1, 1), "VALID", (1, 1))
        return [_Part(f"{layer.name}/depthwise", OpFamily.DEPTHWISE, depthwise),
                _Part(f"{layer.name}/pointwise", OpFamily.CONV2D, pointwise)]
    return [_Part(layer.name, OpFamily.CONV2D, ConvShape(shape, tuple(layer.kernel.shape), strides, padding, dilation))]


def _conv_output(shape: ConvShape) -> tuple[int, int]:
    """A convolution's output height and width (TensorFlow's rule for SAME and VALID)."""
    sizes = []
    for size, taps, stride, dilation in zip(shape.input_shape[1:3], shape.filter_shape[:2], shape.strides,
                                            shape.dilation):
        span = (taps - 1) * dilation + 1
        sizes.append(-(-size // stride) if shape.padding == "SAME" else (size - span) // stride + 1)
    return sizes[0], sizes[1]


def _parse(text, where: str) -> Arithmetic:
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument(f"{where} must be native, twin, or a model spec or GPU preset (e.g. v100:out=fp16, "
                              f"a100, sequential:fp16); received {text!r}")
    try:
        return Arithmetic.parse(text)
    except InvalidArgument as error:
        raise InvalidArgument(str(error).replace("--arithmetic", where, 1)) from None


def _chosen(arithmetic, layers: list) -> dict[int, tuple[Arithmetic, str]]:
    """Each layer's arithmetic and the argument that chose it (keyed by identity: names may
    repeat across nested models): one for all, or a mapping by name (native where it names none)."""
    if not isinstance(arithmetic, Mapping):
        parsed = _parse(arithmetic, "arithmetic")
        return {id(layer): (parsed, f"arithmetic = {parsed.text!r}") for layer in layers}
    names = [layer.name for layer in layers]
    for name in arithmetic:
        if name not in names:
            raise InvalidArgument(f"arithmetic names layer {name!r}, which the model does not have; its layers with "
                                  f"a kernel are {', '.join(names)}")
        if names.count(name) > 1:
            raise InvalidArgument(f"arithmetic names layer {name!r}, and {names.count(name)} layers of the model "
                                  f"(in nested models) have that name: give it one arithmetic for all")
    chosen = {name: _parse(text, f"arithmetic[{name!r}]") for name, text in arithmetic.items()}
    native = Arithmetic.parse(ArithmeticKind.NATIVE)
    return {id(layer): (chosen[layer.name], f"arithmetic[{layer.name!r}] = {chosen[layer.name].text!r}")
            if layer.name in chosen else (native, "not named in arithmetic") for layer in layers}


def _twin_map(arithmetic_map, configuration: str | None) -> TwinMap:
    """The identify map the twin reads, in the configuration this process runs."""
    if arithmetic_map is None:
        raise InvalidArgument("arithmetic 'twin' needs arithmetic_map: the identify map of this model's layers "
                              "(convprobe identify --keras-model M.keras --configs NAME --output map.json)")
    if isinstance(arithmetic_map, (str, Path)):
        document = read_identify_map(arithmetic_map, argument="arithmetic_map")
    elif isinstance(arithmetic_map, Mapping):
        document = dict(arithmetic_map)
    else:
        raise InvalidArgument(f"arithmetic_map must be the path of an identify map or its document; received "
                              f"{type(arithmetic_map).__name__}")
    return TwinMap.read(document, configuration or configuration_in_effect())


def _twin_part(part: _Part, twin: TwinMap) -> tuple[ConvShape, str]:
    """The part's shape as the map measured it: its own, or where its batch is not fixed, the
    one batch the map measured that shape at (said in the record)."""
    if part.shape.input_shape[0] or (part.family, part.shape) in twin.layers:
        return part.shape, ""
    rest = (part.shape.input_shape[1:], part.shape.filter_shape, part.shape.strides, part.shape.padding,
            part.shape.dilation)
    found = [shape for family, shape in twin.layers if family is part.family
             and (shape.input_shape[1:], shape.filter_shape, shape.strides, shape.padding, shape.dilation) == rest]
    if len(found) != 1:
        raise InvalidArgument(f"layer {part.name!r} has no fixed batch and the identify map measured its shape at "
                              f"{len(found)} batch sizes (or row counts): build the model on a fixed batch "
                              f"(keras.Input(..., batch_size=N)) as identify measured it")
    rows = "rows" if part.family is OpFamily.MATMUL else "batch"  # a matmul's: the batch times the leading axes
    return found[0], f" (at {rows} {found[0].input_shape[0]}: the model fixes no batch; others unconfirmed)"


def _entries(layer, parts: list[LayerArithmetic], placement: tuple[BiasPlacement, str] | None) -> list[dict]:
    """A computed layer in the record: each part's shape and ops, the last with where its bias
    is added where the twin measured it."""
    entries = [{"kind": type(layer).__name__, "family": str(part.family), **part.to_dict()} for part in parts]
    if placement is not None:
        entries[-1]["bias"] = {"placement": str(placement[0]), "evidence": placement[1]}
    return entries


def _native_entries(layer, batch: int | None) -> list[dict]:
    """A layer left to TensorFlow's kernel in the record: its parts' shapes where it was built on
    known sizes, its name and kind alone where not (a native layer may take any size)."""
    native = "native: TensorFlow's kernel"
    try:
        return [{"kind": type(layer).__name__, "family": str(part.family),
                 **LayerArithmetic(part.name, part.shape, {op: OpArithmetic(None, native) for op in ConvOp},
                                   part.family).to_dict()} for part in _parts(layer, batch)]
    except InvalidArgument:
        return [{"kind": type(layer).__name__, "layer": layer.name, "ops": {"every op": {
            "arithmetic": "tensorflow", "source": f"{native} (built on inputs of unknown size)"}}}]


def _twin_reason(layer) -> str | None:
    """Why the twin cannot reproduce `layer`, which the emulator can compute under a model: a
    grouped conv, which Keras runs through XLA (`jit_compile`), and a dilated one, which
    TensorFlow runs as a conv of a space-to-batch input; identify measures neither at the
    layer. None for every other layer."""
    kind = type(layer).__name__
    if isinstance(layer, keras.layers.EinsumDense):
        return ("an EinsumDense: TensorFlow runs its Einsum op, which identify does not measure yet; the twin leaves "
                "it to TensorFlow's kernel")
    if getattr(layer, "groups", 1) > 1:
        return (f"a grouped {kind}: Keras runs it through XLA, which identify does not measure at this layer; "
                f"the twin leaves it to TensorFlow's kernel")
    if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D)) and max(layer.dilation_rate) > 1:
        return (f"a dilated {kind}: TensorFlow runs it as a conv of a space-to-batch input, which identify does "
                f"not measure at this layer; the twin leaves it to TensorFlow's kernel")
    return None


def _part_arithmetic(part: _Part, chosen: Arithmetic, why: str, twin: TwinMap | None) -> LayerArithmetic:
    """What each of a part's three ops computes, and why."""
    if chosen.kind is ArithmeticKind.TWIN:
        assert twin is not None, "a twin layer's map is read before its parts"
        shape, note = _twin_part(part, twin)
        measured = twin.layer_arithmetic({part.name: shape}, part.family)[part.name]
        ops = {op: OpArithmetic(a.model, f"use_arithmetic {why}: {a.source}{note}") for op, a in measured.ops.items()}
        return LayerArithmetic(part.name, part.shape, ops, part.family)
    source = f"use_arithmetic {why}" if chosen.emulated else "native: TensorFlow's kernel"
    return LayerArithmetic(part.name, part.shape, {op: OpArithmetic(chosen.model, source) for op in ConvOp},
                           part.family)


@contextlib.contextmanager
def use_arithmetic(model: keras.Model, arithmetic: str | Mapping[str, str], *,
                   arithmetic_map: str | Path | Mapping | None = None,
                   configuration: str | None = None) -> Iterator[dict]:
    """Compute `model`'s convolutions and matmuls under `arithmetic` inside the block (module docstring).

    Args:
        model: a built Keras model (functional, Sequential or subclassed).
        arithmetic: ``"native"``, ``"twin"``, a model spec (``"sequential:fp16"``), a GPU
            preset (``"v100:out=fp16"``), or a mapping from layer name to one of those.
        arithmetic_map: the twin's identify map (a path or the loaded document).
        configuration: the TensorFlow configuration whose answers the twin reads (default:
            the one this process runs, as `convprobe.configure` set it).

    Yields:
        The record of what runs: ``layers`` (each computed layer, or part of one, with its
        shape and, per op, its arithmetic and why), ``not_computed`` (each other layer with a
        kernel, and the reason), ``jit_compile`` (the model's, and the block's).
    """
    if not isinstance(model, keras.Model):
        raise InvalidArgument(f"model must be a Keras model; received {type(model).__name__}")
    layers = _kernel_layers(model)
    if not model.built or any(not layer.built for layer in layers):
        raise InvalidArgument("model must be built before use_arithmetic (call it on a batch, or give it an Input): "
                              "each layer's shapes decide its convolution")
    busy = [layer.name for layer in layers if _PATCHED & set(layer.__dict__)]
    if busy:
        raise InvalidArgument(f"layer {busy[0]!r} is inside another use_arithmetic block already; one block at a "
                              f"time (a mapping gives each layer its own arithmetic)")
    chosen = _chosen(arithmetic, layers)
    reasons = {id(layer): _reason(layer) or (_twin_reason(layer) if chosen[id(layer)][0].kind is ArithmeticKind.TWIN
                                             else None) for layer in layers}
    twins = any(a.kind is ArithmeticKind.TWIN for a, _ in chosen.values())
    if arithmetic_map is not None and not twins:
        raise InvalidArgument("arithmetic_map is read by the twin; no layer's arithmetic is 'twin'")
    if configuration is not None and not twins:
        raise InvalidArgument("configuration names the map's configuration the twin reads; no layer's arithmetic "
                              "is 'twin'")
    if isinstance(arithmetic, Mapping):
        refused = [layer for layer in layers if chosen[id(layer)][0].emulated and reasons[id(layer)] is not None]
        if refused:
            raise InvalidArgument(f"arithmetic names layer {refused[0].name!r}, which use_arithmetic cannot "
                                  f"compute: {reasons[id(refused[0])]}")
    twin = _twin_map(arithmetic_map, configuration) if twins else None
    batch = _fixed_batch(model)
    computable = [layer for layer in layers if reasons[id(layer)] is None]
    parts = {id(layer): [_part_arithmetic(part, *chosen[id(layer)], twin) for part in _parts(layer, batch)]
             for layer in computable if chosen[id(layer)][0].emulated}  # every shape checked before anything changes
    placements = _placements([layer for layer in computable if id(layer) in parts], parts, chosen, batch)
    for layer in computable:
        if placements.get(id(layer), (None,))[0] is BiasPlacement.UNREPRODUCED:
            parts[id(layer)] = _unreproduced(parts[id(layer)], layer)
    emulated = [layer for layer in computable if id(layer) in parts and any(part.emulated for part in parts[id(layer)])]
    patches = {id(layer): _layer_call(layer, parts[id(layer)],
                                      placements.get(id(layer), (None,))[0] is BiasPlacement.FUSED)
               for layer in emulated}
    models = _models(model)
    jit = {id(m): (m._jit_compile if m.compiled else None) for m in models}
    record = {
        "arithmetic": arithmetic if isinstance(arithmetic, str) else dict(arithmetic),
        "arithmetic_map": str(arithmetic_map) if isinstance(arithmetic_map, (str, Path)) else (
            None if arithmetic_map is None else "a document"),
        "configuration": None if twin is None else twin.configuration,
        "layers": [entry for layer in computable for entry in (
            _entries(layer, parts[id(layer)], placements.get(id(layer))) if id(layer) in parts
            else _native_entries(layer, batch))],
        "not_computed": [{"layer": layer.name, "kind": type(layer).__name__, "reason": reasons[id(layer)]}
                         for layer in layers if reasons[id(layer)] is not None],
        "jit_compile": {"model": model.jit_compile if model.compiled else None,
                        "inside": False if emulated else (model.jit_compile if model.compiled else None)},
    }
    try:
        for layer in emulated:
            layer.call = patches[id(layer)]
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


def _fixed_batch(model) -> int | None:
    """The batch size the model's inputs fix (keras.Input(..., batch_size=N)), if one."""
    try:
        batches = {int(shape[0]) for shape in (tuple(t.shape) for t in model.inputs) if shape and shape[0]}
    except (AttributeError, ValueError, TypeError):  # a subclassed model has no symbolic inputs
        return None
    return batches.pop() if len(batches) == 1 else None


#: The instance attributes `use_arithmetic` sets on a layer it reroutes (and removes on exit).
_PATCHED = {"call"}


def _layer_call(layer, parts: list[LayerArithmetic], fused: bool = False):
    """`layer`'s own call (Keras 3.15: its op, bias, activation) with its op computed as `parts`
    name; with `fused`, the bias added inside the last op's kernel (`bias_fusion`)."""
    role = ConvOp.FORWARD
    if isinstance(layer, _MATMULS):  # an EinsumDense's matmul equation reads as a Dense layer's
        product = emulated_matmul(tf, parts[0])

        def op(inputs):
            return product(inputs, layer.kernel), (tf.reshape(inputs, [-1, inputs.shape[-1]]), layer.kernel)
    elif isinstance(layer, keras.layers.Conv1D):  # the conv2d of height 1 TensorFlow runs, causal padding first
        convolution = emulated_convolution(tf, parts[0])

        def op(inputs):
            if layer.padding == "causal":
                inputs = keras.ops.pad(inputs, layer._compute_causal_padding())
            x, w = tf.expand_dims(inputs, 1), tf.expand_dims(layer.kernel, 0)
            return tf.squeeze(convolution(x, w), 1), (x, w)
    elif isinstance(layer, keras.layers.Conv2DTranspose):  # the conv2d's input gradient
        transposed, role = emulated_convolution(tf, parts[0], transposed=True), ConvOp.INPUT_GRADIENT

        def op(inputs):
            return transposed(inputs, layer.kernel), (inputs, layer.kernel)
    elif isinstance(layer, keras.layers.SeparableConv2D):  # tf.nn.separable_conv2d: depthwise, then a 1x1 conv2d
        depthwise, pointwise = (emulated_convolution(tf, part) for part in parts)

        def op(inputs):
            middle = depthwise(inputs, layer.depthwise_kernel)
            return pointwise(middle, layer.pointwise_kernel), (middle, layer.pointwise_kernel)
    else:  # Conv2D, DepthwiseConv2D
        convolution = emulated_convolution(tf, parts[0])

        def op(inputs):
            return convolution(inputs, layer.kernel), (inputs, layer.kernel)
    value = fused_value(parts[-1], role) if fused else None

    def call(inputs, training=None):
        outputs, (first, kernel) = op(inputs)
        if getattr(layer, "bias", None) is not None:
            bias = layer.bias
            outputs = keras.ops.add(outputs, bias if isinstance(layer, _MATMULS) else
                                    keras.ops.reshape(bias, (1,) * (len(outputs.shape) - 1) + (-1,)))
            if value is not None:
                outputs = with_value(tf, outputs, _fused(value, first, kernel, bias, outputs))
        return outputs if layer.activation is None else layer.activation(outputs)
    return call


def _fused(value, first, kernel, bias, outputs):
    """The fused sum `value` computes, in the shape of `outputs`."""
    operands = [tf.convert_to_tensor(a) for a in (first, kernel, bias)]
    operands = [tf.cast(a, tf.float16) for a in operands]
    if tf.executing_eagerly():
        result = tf.constant(value(*(a.numpy() for a in operands)))
    else:
        result = tf.numpy_function(value, operands, tf.float16, stateful=False, name="emulated_fused_bias")
    return tf.reshape(result, tf.shape(outputs))


def _placements(layers: list, parts: dict, chosen: dict, batch: int | None) -> dict[int, tuple[BiasPlacement, str]]:
    """Where TensorFlow adds each twin layer's bias (`bias_fusion`), for the layers whose last
    op the twin emulates; the evidence in words."""
    out = {}
    for layer in layers:
        last = parts[id(layer)][-1]
        role = ConvOp.INPUT_GRADIENT if isinstance(layer, keras.layers.Conv2DTranspose) else ConvOp.FORWARD
        if (chosen[id(layer)][0].kind is not ArithmeticKind.TWIN or getattr(layer, "bias", None) is None
                or last.ops[role].model is None):
            continue
        calls = {BiasPlacement.SEPARATE: _layer_call(layer, parts[id(layer)])}
        if fused_value(last, role) is not None:
            calls[BiasPlacement.FUSED] = _layer_call(layer, parts[id(layer)], fused=True)
        placement = bias_placement(tf, layer, calls, batch or 1)
        out[id(layer)] = (placement, {
            BiasPlacement.SEPARATE: "added after the op's fp16 result: measured, the layer's own output bit for bit",
            BiasPlacement.FUSED: "added inside the op's kernel before its one rounding (a fused oneDNN kernel): "
                                 "measured, the layer's own output bit for bit",
            BiasPlacement.UNREPRODUCED: "neither added after the op nor inside its kernel reproduced the layer's "
                                        "own output: its forward op runs TensorFlow's kernel"}[placement])
    return out


def _unreproduced(parts: list[LayerArithmetic], layer) -> list[LayerArithmetic]:
    """`parts` with the last op's forward role TensorFlow's own kernel (its bias placement not reproduced)."""
    role = ConvOp.INPUT_GRADIENT if isinstance(layer, keras.layers.Conv2DTranspose) else ConvOp.FORWARD
    last = parts[-1]
    ops = {**last.ops, role: OpArithmetic(None, "TensorFlow's own kernel: the twin reproduced the op, but not the "
                                                "layer's output with its bias (bias_fusion)")}
    return [*parts[:-1], LayerArithmetic(last.name, last.shape, ops, last.family)]


def _forget_functions(model) -> None:
    """Keras builds its train, test and predict functions once: drop them, so that the next
    call traces the layers as they are now."""
    for name in ("train_function", "test_function", "predict_function"):
        if hasattr(model, name):
            setattr(model, name, None)
