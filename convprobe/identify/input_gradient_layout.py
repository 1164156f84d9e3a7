"""An input gradient measured as the forward convolution it is under XLA.

A CPU input gradient is one of two GEMMs. TensorFlow's Eigen kernel multiplies dy by the
filter's transpose and scatters the (tap, channel) columns into dx (col2im:
`column_patterns`, `tile_patterns`). XLA computes it as a forward convolution of dy
with the 180-degree rotated filter: rows are dx pixels (n, h, w), columns input channels,
K the taps (i, j, o) - the emulator's own order. At 1,6,6,18 * 2,2,18,21 VALID strict XLA
sums columns 0-15 in rounded products and 16-17 with fp32 additions
(`columns(sequential:fp16:product=fp16 * 16, sequential:fp16:addition=fp32)`), which no
col2im measurement gives.

`AsForward` wraps a backend so that `conv2d` on `forward_layer(layer)` runs `layer`'s
input gradient: dy is that conv's input, with explicit padding (KH - 1) * dilation on
each side, so every dx pixel's window lies inside dy; the GEMM (M = N*H*W, N = C_in,
K = KH*KW*C_out) is the layer's own. Every forward probe (tiles, window probe, crafted
rows) then measures it unchanged; identify confirms each spec at the user's own layer.
Stride 1 only: a strided input gradient is a conv of a dilated dy.
"""

from __future__ import annotations

import numpy as np

from convprobe.identify.rewritten_calls import RewrittenCalls
from convprobe.probes.layers import Layer

__all__ = ["AsForward", "forward_layer"]


def forward_layer(layer: Layer) -> Layer | None:
    """The VALID forward layer whose conv2d is `layer`'s input gradient (None: strided)."""
    if layer.strides != (1, 1):
        return None
    n, h, w, c = layer.input_shape
    kh, kw, _, cout = layer.filter_shape
    (dh, dw) = layer.dilation
    return Layer((n, h + (kh - 1) * dh, w + (kw - 1) * dw, cout), (kh, kw, cout, c), (1, 1), "VALID",
                 layer.dilation, layer.name)


class AsForward(RewrittenCalls):
    """`backend` with `conv2d` on `forward_layer(layer)` run as `layer`'s input gradient
    (the forward filter w'[i, j, o, c] is the layer's w[KH-1-i, KW-1-j, c, o]); no other op."""

    rewritten_ops = frozenset({"conv2d"})

    def __init__(self, backend, layer: Layer):
        super().__init__(backend)
        self.layer = layer

    def _call(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        if name != "conv2d":  # its gradients are not this layer's: no call passes through
            raise ValueError(f"AsForward runs conv2d only; received {name}")
        return super()._call(name, args, kwargs)

    def rewrite(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        dy, w = args[0], np.asarray(args[1])
        kh, kw = self.layer.filter_shape[:2]
        (dh, dw) = self.layer.dilation
        filter_ = np.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2))
        padding = (((kh - 1) * dh, (kh - 1) * dh), ((kw - 1) * dw, (kw - 1) * dw))
        return ("conv2d_backprop_input", (dy, filter_, self.layer.input_shape),
                {"strides": 1, "padding": padding, "dilation": self.layer.dilation})
