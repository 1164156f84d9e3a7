"""A Dense layer's matmuls measured as the 1x1 conv2d they equal.

``x @ W`` with x (rows, K) and W (K, units) is the conv2d of input (rows, 1, 1, K) and
filter (1, 1, K, units); its input gradient ``dy @ W.T`` is that conv2d's input gradient
and its kernel gradient ``x.T @ dy`` the filter gradient, each output reduced along the
same axis. So every probe laid out for a conv2d (structure, direct sum, trees, the
emulator's predictions) measures a matmul unchanged, once `AsMatmul` runs the conv2d's
three ops as the MatMul calls TensorFlow's registered gradient makes (`MatMul(dy, W,
transpose_b=True)` and `MatMul(x, dy, transpose_a=True)`). The results line up element for
element ((rows, units) and (rows, 1, 1, units) flatten alike).
"""

from __future__ import annotations

import numpy as np

from convprobe.identify.rewritten_calls import RewrittenCalls
from convprobe.probes.layers import LAYER_OPS, MATMUL_OPS, Layer, LayerKind

__all__ = ["AsMatmul", "conv_layer", "conv_op", "measured_form"]


def conv_layer(layer: Layer) -> Layer:
    """The 1x1 conv2d layer a matmul `layer` is."""
    return Layer(layer.input_shape, layer.filter_shape, layer.strides, layer.padding, layer.dilation, layer.name,
                 LayerKind.CONV2D)


def conv_op(op: str) -> str:
    """The conv2d op that a matmul op is."""
    return dict(zip(MATMUL_OPS, LAYER_OPS))[op]


def measured_form(layer: Layer, op: str, backend=None):
    """(layer, op, backend) as the probes measure them: a matmul as its conv2d on a backend that
    runs that conv2d's ops as matmuls; any other layer as it is."""
    if layer.kind is not LayerKind.MATMUL:
        return layer, op, backend
    return conv_layer(layer), conv_op(op), None if backend is None else AsMatmul(backend)


class AsMatmul(RewrittenCalls):
    """`backend` with a 1x1 conv2d's three ops run as matmuls: TensorFlow's exact MatMul calls
    where the backend offers them (`mat_mul`), `matmul` on transposed copies elsewhere."""

    rewritten_ops = frozenset(LAYER_OPS)

    def rewrite(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        first, second = (np.asarray(a) for a in args[:2])
        rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731 - (n, 1, 1, c) -> (n, c)
        if name == "conv2d":  # x (n,1,1,K), w (1,1,K,units)
            a, b, flags = rows(first), rows(second), {}
        elif name == "conv2d_backprop_input":  # dy (n,1,1,units), w: dy @ w.T
            a, b, flags = rows(first), rows(second), {"transpose_b": True, "grad_a": True}
        else:  # x (n,1,1,K), dy (n,1,1,units): x.T @ dy
            a, b, flags = rows(first), rows(second), {"transpose_a": True, "grad_b": True}
        if hasattr(self.backend, "mat_mul"):
            return "mat_mul", (a, b), flags
        a = a.T if flags.get("transpose_a") else a
        b = b.T if flags.get("transpose_b") else b
        return "matmul", (np.ascontiguousarray(a), np.ascontiguousarray(b)), {}

    def _run(self, name: str, args: tuple, kwargs: dict):
        return np.asarray(super()._run(name, args, kwargs)).reshape(_result_shape(name, args))

    def _run_together(self, calls):
        results = self.backend.run_together([self._call(*call) for call in calls])
        return [np.asarray(r).reshape(_result_shape(name, args)) for r, (name, args, _) in zip(results, calls)]


def _result_shape(name: str, args: tuple) -> tuple[int, ...]:
    """The conv2d op's result shape: y (n, 1, 1, units), dx its input's, dw its filter's."""
    if name == "conv2d":
        return (np.shape(args[0])[0], 1, 1, np.shape(args[1])[-1])
    return tuple(args[2])
