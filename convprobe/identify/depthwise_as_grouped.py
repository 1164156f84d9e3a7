"""A depthwise layer's ops measured as the grouped conv2d they are.

A depthwise conv with filter (KH, KW, C, M) is the grouped conv2d with filter
(KH, KW, 1, C*M) and C groups: output channel c*M + m sums input channel c's taps. Its
input gradient and filter gradient are that grouped conv's, with the filter laid out the
same way. `AsGrouped` wraps a backend so that the grouped conv2d's three ops at
`grouped_layer(layer)` run the backend's depthwise kernels: the summation trees are then
recovered through TensorFlow's own depthwise ops by the method that recovers any grouped
conv's (`layer_trees`), rather than from a list of kernels foreseen. The result arrays
line up element for element ((KH, KW, C, M) and (KH, KW, 1, C*M) flatten alike), and the
emulator computes a depthwise op as that grouped conv2d, so a recovered spec means the
same at either layer.
"""

from __future__ import annotations

import numpy as np

from convprobe.identify.rewritten_calls import RewrittenCalls
from convprobe.probes.layers import DEPTHWISE_OPS, LAYER_OPS, Layer, LayerKind

__all__ = ["AsGrouped", "grouped_layer", "grouped_op"]


def grouped_layer(layer: Layer) -> Layer:
    """The grouped conv2d layer a depthwise `layer` is (C groups of one input channel)."""
    kh, kw, c, multiplier = layer.filter_shape
    return Layer(layer.input_shape, (kh, kw, 1, c * multiplier), layer.strides, layer.padding, layer.dilation,
                 layer.name, LayerKind.CONV2D)


def grouped_op(op: str) -> str:
    """The grouped conv2d's op that a depthwise op is."""
    return dict(zip(DEPTHWISE_OPS, LAYER_OPS))[op]


class AsGrouped(RewrittenCalls):
    """`backend` with the grouped conv2d's ops at `grouped_layer(layer)` run as `layer`'s
    depthwise ops (the filter (KH, KW, 1, C*M) read as (KH, KW, C, M))."""

    rewritten_ops = frozenset(LAYER_OPS)

    def __init__(self, backend, layer: Layer):
        super().__init__(backend)
        self.layer = layer

    def rewrite(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        depthwise = dict(zip(LAYER_OPS, DEPTHWISE_OPS))[name]
        shape = self.layer.filter_shape
        if name == "conv2d_backprop_filter":  # (x, dy, filter shape): the depthwise filter's shape
            return depthwise, (args[0], args[1], shape), kwargs
        first, w, *rest = args
        return depthwise, (first, np.asarray(w).reshape(shape), *rest), kwargs

    def conv2d_backprop_filter(self, x, dy, filter_shape, **kwargs):
        """The depthwise filter gradient in the grouped layout (KH, KW, 1, C*M)."""
        return np.asarray(self._run("conv2d_backprop_filter", (x, dy, filter_shape), kwargs)).reshape(filter_shape)
