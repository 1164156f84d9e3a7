"""A Keras conv layer whose forward pass and both gradients run the arithmetic a run chose.

Each op is either TensorFlow's own kernel (the same op its registered gradient calls:
Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter, with the layer's strides, padding
and dilation) or the exact emulator under a model, reached through `tf.numpy_function`
inside a `tf.custom_gradient`. The emulator's ops are the ones identify confirms its
models with (`EmulatedBackend`), so a twin computes what identify claimed.

`tf.numpy_function` cannot be compiled by XLA: a run with emulated arithmetic runs its
step as a graph without jit, and the configuration decides TensorFlow's own kernels.
TensorFlow is passed in (`tf`), never imported here: the harness sets the environment
before TensorFlow starts.
"""

from __future__ import annotations

import numpy as np

from convprobe.backends.emulated import EmulatedBackend
from convprobe.emulation.conv import conv_output_shape, resolve_padding
from convprobe.errors import InvalidArgument
from convprobe.training.arithmetic import ConvOp, LayerArithmetic

__all__ = ["emulated_convolution"]


def _emulated(backend: EmulatedBackend, method: str, result_shape: tuple[int, ...] | None, **conv_args):
    """A NumPy function of two fp16 arrays that runs `method` of the emulator. A gradient
    names the shape of its result (`result_shape`), whose batch is the first array's."""
    def run(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        extra = () if result_shape is None else (
            (first.shape[0], *result_shape[1:]) if method == "conv2d_backprop_input" else result_shape,)
        out = getattr(backend, method)(first, second, *extra, **conv_args)
        return np.asarray(out).astype(np.float16, copy=False)
    return run


def emulated_convolution(tf, arithmetic: LayerArithmetic):
    """(x, w) -> y for one conv layer, with the custom gradient `arithmetic` names."""
    shape = arithmetic.shape
    strides, dilation, padding = shape.strides, shape.dilation, shape.padding
    conv_args = dict(strides=strides, padding=padding, dilation=dilation)
    sh, sw = strides
    dh, dw = dilation
    models = {op: a.model for op, a in arithmetic.ops.items()}
    input_shape, filter_shape = list(shape.input_shape), list(shape.filter_shape)

    def call(op: ConvOp, method: str, first, second, out_shape, result_shape=None):
        fn = _emulated(EmulatedBackend(models[op]), method, result_shape, **conv_args)
        if tf.executing_eagerly():  # a model called eagerly (TF's eager numpy_function trips NumPy 2's __array__)
            return tf.constant(fn(first.numpy(), second.numpy()))
        out = tf.numpy_function(fn, [first, second], tf.float16, stateful=False,
                                name=f"emulated_{method}")
        out.set_shape(out_shape)
        return out

    @tf.custom_gradient
    def convolution(x, w):
        if models[ConvOp.FORWARD] is None:
            y = tf.raw_ops.Conv2D(input=x, filter=w, strides=[1, sh, sw, 1], padding=padding,
                                  dilations=[1, dh, dw, 1])
        else:
            y = call(ConvOp.FORWARD, "conv2d", x, w, [x.shape[0], *_output_shape(shape)[1:]])

        def gradient(dy):
            if models[ConvOp.INPUT_GRADIENT] is None:
                dx = tf.raw_ops.Conv2DBackpropInput(input_sizes=tf.shape(x), filter=w, out_backprop=dy,
                                                    strides=[1, sh, sw, 1], padding=padding,
                                                    dilations=[1, dh, dw, 1])
            else:
                dx = call(ConvOp.INPUT_GRADIENT, "conv2d_backprop_input", dy, w, [dy.shape[0], *input_shape[1:]],
                          input_shape)
            if models[ConvOp.FILTER_GRADIENT] is None:
                dwt = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=tf.shape(w), out_backprop=dy,
                                                      strides=[1, sh, sw, 1], padding=padding,
                                                      dilations=[1, dh, dw, 1])
            else:
                dwt = call(ConvOp.FILTER_GRADIENT, "conv2d_backprop_filter", x, dy, filter_shape, filter_shape)
            return dx, dwt

        return y, gradient

    def read_then_convolve(x, w):
        """The kernel read before the custom gradient (a Keras layer passes its variable, and an
        eager custom gradient refuses a function that reads a variable itself)."""
        spatial = tuple(x.shape[1:3])
        if None not in spatial and spatial != tuple(input_shape[1:3]):
            raise InvalidArgument(f"layer {arithmetic.name!r} is computed at the {input_shape[1]}x{input_shape[2]} "
                                  f"inputs it was built on; received {spatial[0]}x{spatial[1]}")
        return convolution(x, tf.convert_to_tensor(w))

    return read_then_convolve


def _output_shape(shape) -> list[int]:
    n, h, w, _ = shape.input_shape
    kh, kw, _, cout = shape.filter_shape
    pads = resolve_padding(shape.padding, (h, w), (kh, kw), shape.strides, shape.dilation)
    return [n, *conv_output_shape((h, w), (kh, kw), shape.strides, shape.dilation, pads), cout]
