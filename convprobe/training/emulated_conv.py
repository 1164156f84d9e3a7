"""A Keras conv layer whose forward pass and both gradients run the arithmetic a run chose.

Each op is either TensorFlow's own kernel (the same op its registered gradient calls:
Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter, or the DepthwiseConv2dNative three,
with the layer's strides, padding and dilation) or the exact emulator under a model,
reached through `tf.numpy_function` inside a `tf.custom_gradient`. The emulator's ops are
the ones identify confirms its models with (`EmulatedBackend`), so a twin computes what
identify claimed.

A Conv2DTranspose runs the same three ops of the conv2d it transposes with their roles
swapped (TensorFlow computes its forward pass as that conv2d's Conv2DBackpropInput, whose
registered gradient is the Conv2D and the Conv2DBackpropFilter): identify measures it so,
and `emulated_convolution(..., transposed=True)` computes it so.

`tf.numpy_function` cannot be compiled by XLA: a run with emulated arithmetic runs its
step as a graph without jit, and the configuration decides TensorFlow's own kernels.
TensorFlow is passed in (`tf`), never imported here: the harness sets the environment
before TensorFlow starts.
"""

from __future__ import annotations

import numpy as np

from convprobe.backends.emulated import EmulatedBackend
from convprobe.emulation import default_float_environment
from convprobe.emulation.conv import conv_output_shape, resolve_padding
from convprobe.errors import InvalidArgument
from convprobe.training.arithmetic import ConvOp, LayerArithmetic, OpFamily

__all__ = ["emulated_convolution"]

#: TensorFlow's raw op of each role, per family.
_RAW_OPS = {OpFamily.CONV2D: ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"),
            OpFamily.DEPTHWISE: ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                                 "DepthwiseConv2dNativeBackpropFilter")}


def _emulated(backend: EmulatedBackend, method: str, result_shape: tuple[int, ...] | None, **conv_args):
    """A NumPy function of two fp16 arrays that runs `method` of the emulator. A gradient
    names the shape of its result (`result_shape`), whose batch is the first array's."""
    def run(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        extra = () if result_shape is None else (
            (first.shape[0], *result_shape[1:]) if method.endswith("backprop_input") else result_shape,)
        with default_float_environment():  # TensorFlow's thread flushes subnormals; the emulator must not
            out = getattr(backend, method)(first, second, *extra, **conv_args)
        return np.asarray(out).astype(np.float16, copy=False)
    return run


class _Ops:
    """A layer's three ops, each TensorFlow's kernel or the emulator under its model:
    `forward(x, w)`, `input_gradient(dy, w)` (dx of the input shape, the batch dy's) and
    `filter_gradient(x, dy)`."""

    def __init__(self, tf, arithmetic: LayerArithmetic):
        self.tf, self.arithmetic = tf, arithmetic
        shape = arithmetic.shape
        self.input_shape, self.filter_shape = list(shape.input_shape), list(shape.filter_shape)
        self.output_shape = _output_shape(shape, arithmetic.family)
        self.conv_args = dict(strides=shape.strides, padding=shape.padding, dilation=shape.dilation)
        self.raw = dict(zip(ConvOp, _RAW_OPS[arithmetic.family]))
        self.tf_args = dict(strides=[1, *shape.strides, 1], padding=shape.padding, dilations=[1, *shape.dilation, 1])

    def _emulate(self, op: ConvOp, first, second, out_shape, result_shape=None):
        tf = self.tf
        method = self.arithmetic.family.op_names[op]
        fn = _emulated(EmulatedBackend(self.arithmetic.ops[op].model), method, result_shape, **self.conv_args)
        if tf.executing_eagerly():  # a model called eagerly (TF's eager numpy_function trips NumPy 2's __array__)
            return tf.constant(fn(first.numpy(), second.numpy()))
        out = tf.numpy_function(fn, [first, second], tf.float16, stateful=False, name=f"emulated_{method}")
        out.set_shape(out_shape)
        return out

    def _native(self, op: ConvOp) -> bool:
        return self.arithmetic.ops[op].model is None

    def forward(self, x, w):
        if self._native(ConvOp.FORWARD):
            return getattr(self.tf.raw_ops, self.raw[ConvOp.FORWARD])(input=x, filter=w, **self.tf_args)
        return self._emulate(ConvOp.FORWARD, x, w, [x.shape[0], *self.output_shape[1:]])

    def input_gradient(self, dy, w):
        batch = self.tf.shape(dy)[0]
        if self._native(ConvOp.INPUT_GRADIENT):
            sizes = self.tf.concat([[batch], self.input_shape[1:]], axis=0)
            return getattr(self.tf.raw_ops, self.raw[ConvOp.INPUT_GRADIENT])(
                input_sizes=sizes, filter=w, out_backprop=dy, **self.tf_args)
        return self._emulate(ConvOp.INPUT_GRADIENT, dy, w, [dy.shape[0], *self.input_shape[1:]], self.input_shape)

    def filter_gradient(self, x, dy):
        if self._native(ConvOp.FILTER_GRADIENT):
            return getattr(self.tf.raw_ops, self.raw[ConvOp.FILTER_GRADIENT])(
                input=x, filter_sizes=self.filter_shape, out_backprop=dy, **self.tf_args)
        return self._emulate(ConvOp.FILTER_GRADIENT, x, dy, self.filter_shape, self.filter_shape)

    def checked(self, spatial: tuple, expected: tuple, function, x, w):
        """`function(x, w)` with the kernel read first (a Keras layer passes its variable, and an
        eager custom gradient refuses a function that reads a variable itself), once the input's
        height and width are those the layer was built on."""
        if None not in spatial and spatial != expected:
            raise InvalidArgument(f"layer {self.arithmetic.name!r} is computed at the {expected[0]}x{expected[1]} "
                                  f"inputs it was built on; received {spatial[0]}x{spatial[1]}")
        return function(x, self.tf.convert_to_tensor(w))


def emulated_convolution(tf, arithmetic: LayerArithmetic, *, transposed: bool = False):
    """(x, w) -> y for one conv2d or depthwise layer, with the custom gradient `arithmetic`
    names; with `transposed`, for a Conv2DTranspose: `arithmetic` is then the conv2d it
    transposes (its input the layer's output), whose input gradient is the layer's forward
    pass, its forward pass the layer's input gradient."""
    ops = _Ops(tf, arithmetic)

    @tf.custom_gradient
    def convolution(x, w):
        def gradient(dy):
            if transposed:
                return ops.forward(dy, w), ops.filter_gradient(dy, x)
            return ops.input_gradient(dy, w), ops.filter_gradient(x, dy)
        return (ops.input_gradient(x, w) if transposed else ops.forward(x, w)), gradient

    built = ops.output_shape if transposed else ops.input_shape  # the layer's own input

    def read_then_convolve(x, w):
        return ops.checked(tuple(x.shape[1:3]), tuple(built[1:3]), convolution, x, w)

    return read_then_convolve


def _output_shape(shape, family: OpFamily) -> list[int]:
    n, h, w, c = shape.input_shape
    kh, kw, _, cout = shape.filter_shape
    pads = resolve_padding(shape.padding, (h, w), (kh, kw), shape.strides, shape.dilation)
    channels = c * cout if family is OpFamily.DEPTHWISE else cout  # a depthwise filter's last axis: the multiplier
    return [n, *conv_output_shape((h, w), (kh, kw), shape.strides, shape.dilation, pads), channels]
