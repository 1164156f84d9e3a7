"""A Keras Dense layer's matmul and both gradients under an emulated arithmetic.

A Dense layer computes ``y = x @ W`` over its last axis; its gradients are two more
products, ``dx = dy @ W.T`` and ``dW = x.T @ dy`` (summed over every row of the batch).
Each is computed by the exact emulator's `dot` (`convprobe.emulation.dot`), each output
element one reduction in order along its axis under the model, reached through
`tf.numpy_function` inside a `tf.custom_gradient`, as `emulated_conv` does for a conv
layer. TensorFlow is passed in (`tf`), never imported here.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from convprobe.emulation import AccumulationModel, dot

__all__ = ["DenseOp", "emulated_matmul"]


class DenseOp(StrEnum):
    """The three products of a Dense layer's training step, as the record names them."""

    FORWARD = "matmul"
    INPUT_GRADIENT = "matmul_input_gradient"
    KERNEL_GRADIENT = "matmul_kernel_gradient"


def _forward(model: AccumulationModel):
    def run(x: np.ndarray, w: np.ndarray) -> np.ndarray:  # (n, K) @ (K, units): rows of x against columns of w
        return np.asarray(dot(x[:, None, :], w.T[None, :, :], model)).astype(np.float16)
    return run


def _input_gradient(model: AccumulationModel):
    def run(dy: np.ndarray, w: np.ndarray) -> np.ndarray:  # (n, units) @ (units, K)
        return np.asarray(dot(dy[:, None, :], w[None, :, :], model)).astype(np.float16)
    return run


def _kernel_gradient(model: AccumulationModel):
    def run(x: np.ndarray, dy: np.ndarray) -> np.ndarray:  # (K, n) @ (n, units): summed over the batch
        return np.asarray(dot(x.T[:, None, :], dy.T[None, :, :], model)).astype(np.float16)
    return run


def emulated_matmul(tf, model: AccumulationModel):
    """(x, W) -> x @ W over x's last axis, its forward pass and both gradients under `model`."""
    def call(function, first, second, shape):
        if tf.executing_eagerly():  # a model called eagerly (TF's eager numpy_function trips NumPy 2's __array__)
            return tf.constant(function(first.numpy(), second.numpy()))
        out = tf.numpy_function(function, [first, second], tf.float16, stateful=False, name="emulated_matmul")
        out.set_shape(shape)
        return out

    @tf.custom_gradient
    def matmul(x, w):
        depth, units = w.shape
        leading = tf.shape(x)[:-1]
        rows = tf.reshape(x, [-1, depth])
        y = call(_forward(model), rows, w, [None, units])

        def gradient(dy):
            dy_rows = tf.reshape(dy, [-1, units])
            dx = call(_input_gradient(model), dy_rows, w, [None, depth])
            dw = call(_kernel_gradient(model), rows, dy_rows, [depth, units])
            return tf.reshape(dx, tf.shape(x)), dw

        return tf.reshape(y, tf.concat([leading, [units]], axis=0)), gradient

    def read_then_multiply(x, w):
        """The kernel read before the custom gradient (an eager custom gradient refuses a
        function that reads a variable itself)."""
        return matmul(x, tf.convert_to_tensor(w))

    return read_then_multiply
