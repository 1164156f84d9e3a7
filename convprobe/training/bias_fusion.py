"""Whether TensorFlow adds a layer's bias inside its convolution or matmul, and that sum emulated.

With oneDNN on (the `default` and `fp16-acc` configurations), TensorFlow's graph optimiser
fuses a conv, depthwise conv or matmul with the bias add after it (and a ReLU) into one
oneDNN kernel, which adds the bias to the fp32 accumulator and rounds to fp16 once:
``round16(acc32 + b)``, where the ops run one after the other give
``round16(round16(acc32) + b)``. Measured: on a Conv2D with a bias in the default
configuration, the fused sum reproduced TensorFlow's output bit for bit and the separate
one differed in 220 of 2,048 outputs. A twin that computes the op alone and adds the bias
after cannot reproduce such a layer, and whether the fusion happens depends on the
configuration, the layer and its graph.

So the twin asks TensorFlow, in the process that trains: `bias_placement` runs the layer's
own call inside a `tf.function` that also takes its gradients (the graph a training step
builds around it), at the layer's shape, on seeded weights and inputs, and compares the
output bit for bit with the twin's layer computing the bias separately and fused
(`fused_value`). The layer's weights are restored afterwards. A ReLU commutes with the
rounding, so it needs no emulation of its own; another activation fused into the kernel
makes both candidates fail, and the layer's forward pass then runs TensorFlow's kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import StrEnum

import numpy as np

from convprobe.emulation import conv2d, conv2d_backprop_input, default_float_environment, dot
from convprobe.errors import InvalidArgument
from convprobe.formats import FP32
from convprobe.training.arithmetic import ConvOp, LayerArithmetic, OpFamily

__all__ = ["BiasPlacement", "fused_value", "bias_placement", "with_value"]


class BiasPlacement(StrEnum):
    """Where the layer's bias is added, as measured: after the op's fp16 result, or inside its
    kernel before the one rounding (fused); `unreproduced` where neither matches."""

    SEPARATE = "separate"
    FUSED = "fused"
    UNREPRODUCED = "unreproduced"


def _wide(model):
    """The model with its result kept in fp32 (no final rounding), or None where it has none."""
    try:
        return dataclasses.replace(model, output=FP32)
    except (TypeError, ValueError, InvalidArgument):
        return None


def fused_value(part: LayerArithmetic, role: ConvOp) -> Callable | None:
    """A NumPy function (first, w, bias) -> round16(op in fp32 + bias): `role` of `part` (its
    forward op; a Conv2DTranspose's is the input gradient) under its model with the result
    kept in fp32, the bias added in fp32, rounded to fp16 once. None where the op runs
    TensorFlow's kernel or its model cannot keep its result in fp32."""
    model = part.ops[role].model
    wide = None if model is None else _wide(model)
    if wide is None:
        return None
    shape = part.shape
    strides, padding, dilation = shape.strides, shape.padding, shape.dilation

    def run(first: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
        with default_float_environment():  # TensorFlow's thread flushes subnormals; the emulator must not
            return _fused(first, w, bias)

    def _fused(first: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
        if part.family is OpFamily.MATMUL:
            out = dot(first[:, None, :], w.T[None, :, :], wide)
        elif part.family is OpFamily.DEPTHWISE:
            kh, kw, channels, multiplier = w.shape
            out = conv2d(first, w.reshape(kh, kw, 1, channels * multiplier), wide, groups=channels, strides=strides, padding=padding, dilation=dilation)
        elif role is ConvOp.INPUT_GRADIENT:
            out = conv2d_backprop_input(first, w, (first.shape[0], *shape.input_shape[1:]), wide,
                                        groups=shape.input_shape[3] // w.shape[2], strides=strides, padding=padding,
                                        dilation=dilation)
        else:
            out = conv2d(first, w, wide, groups=first.shape[-1] // w.shape[2], strides=strides, padding=padding, dilation=dilation)
        total = np.asarray(out, np.float32) + bias.astype(np.float32).reshape(-1)
        return total.astype(np.float16)
    return run


def with_value(tf, y, value):
    """`value`, with the gradient passed to `y` unchanged: the layer's own bias add and its
    gradient stay Keras's, and only the forward value is the fused kernel's (an inf in `y`,
    a separate sum that overflowed where the fused one did not, changes nothing)."""
    @tf.custom_gradient
    def replaced(separate, fused):
        return tf.identity(fused), lambda upstream: (upstream, tf.zeros_like(fused))
    return replaced(y, value)


def bias_placement(tf, layer, calls: dict[BiasPlacement, Callable], batch: int, seed: int = 0) -> BiasPlacement:
    """Where TensorFlow adds `layer`'s bias in this process: the first of `calls` (the layer's
    call computing it separately, then fused) whose output equals TensorFlow's own, bit for
    bit, in a training graph on seeded weights and inputs (see the module docstring)."""
    rng = np.random.default_rng([seed, len(layer.name), *layer.name.encode()])
    shape = tuple(layer.get_build_config()["input_shape"])
    x = tf.constant(rng.uniform(-1, 1, (shape[0] or batch, *shape[1:])).astype(np.float32))
    saved = [v.numpy() for v in layer.weights]

    def outputs():
        @tf.function(autograph=False)
        def step(x):
            with tf.GradientTape() as tape:
                y = layer(x, training=True)
                loss = tf.reduce_sum(tf.cast(y, tf.float32))
            return y, tape.gradient(loss, layer.trainable_variables)
        return step(x)[0].numpy().view(np.uint16)

    try:
        for variable in layer.weights:  # fp16 values of the scale of a trained layer's
            fan_in = max(1, int(np.prod(variable.shape[:-1])))
            values = rng.uniform(-1, 1, variable.shape) * (1.0 if len(variable.shape) == 1 else fan_in ** -0.5)
            variable.assign(values.astype(np.float16).astype(variable.dtype))
        native = outputs()
        for placement, call in calls.items():
            layer.call = call
            try:
                if np.array_equal(outputs(), native):
                    return placement
            finally:
                layer.__dict__.pop("call", None)
        return BiasPlacement.UNREPRODUCED
    finally:
        for variable, value in zip(layer.weights, saved):
            variable.assign(value)
