"""A Keras Dense layer's matmul and both gradients under the arithmetic a run chose.

A Dense layer computes ``y = x @ W`` over its last axis; its gradients are two more
products, ``dx = dy @ W.T`` and ``dW = x.T @ dy`` (summed over every row of the batch),
which TensorFlow's registered gradient runs as MatMul with transpose_b and with
transpose_a. Each is either that MatMul (TensorFlow's kernel) or the exact emulator's `dot`
(`convprobe.emulation.dot`, each output element one reduction in order along its axis,
as identify's matmul models are confirmed), reached through `tf.numpy_function` inside a
`tf.custom_gradient`, as `emulated_conv` does for a conv layer. The layer's arithmetic is
keyed as identify keys a matmul: the 1x1 conv2d of input (rows, 1, 1, K) and filter
(1, 1, K, units). TensorFlow is passed in (`tf`), never imported here.
"""

from __future__ import annotations

import numpy as np

from convprobe.emulation import AccumulationModel, default_float_environment, dot
from convprobe.training.arithmetic import ConvOp, LayerArithmetic

__all__ = ["emulated_matmul"]


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


def _in_default_environment(function):
    """`function` run in the default floating-point environment (TensorFlow's thread flushes
    subnormals; the emulator must not)."""
    def run(*arrays):
        with default_float_environment():
            return function(*arrays)
    return run


#: Each role's emulated product and TensorFlow's MatMul flags for it (the registered gradient's).
_PRODUCTS = {ConvOp.FORWARD: (_forward, {}),
             ConvOp.INPUT_GRADIENT: (_input_gradient, {"transpose_b": True, "grad_a": True}),
             ConvOp.FILTER_GRADIENT: (_kernel_gradient, {"transpose_a": True, "grad_b": True})}


def emulated_matmul(tf, arithmetic: LayerArithmetic):
    """(x, W) -> x @ W over x's last axis, its forward pass and both gradients as `arithmetic` names."""
    def call(op: ConvOp, first, second, shape):
        product, flags = _PRODUCTS[op]
        model = arithmetic.ops[op].model
        if model is None:
            return tf.raw_ops.MatMul(a=first, b=second, **flags)
        function = _in_default_environment(product(model))
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
        y = call(ConvOp.FORWARD, rows, w, [None, units])

        def gradient(dy):
            dy_rows = tf.reshape(dy, [-1, units])
            dx = call(ConvOp.INPUT_GRADIENT, dy_rows, w, [None, depth])
            dw = call(ConvOp.FILTER_GRADIENT, rows, dy_rows, [depth, units])
            return tf.reshape(dx, tf.shape(x)), dw

        return tf.reshape(y, tf.concat([leading, [units]], axis=0)), gradient

    def read_then_multiply(x, w):
        """The kernel read before the custom gradient (an eager custom gradient refuses a
        function that reads a variable itself)."""
        return matmul(x, tf.convert_to_tensor(w))

    return read_then_multiply
