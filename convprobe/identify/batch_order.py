"""A filter gradient's crafted rows laid out with the batch innermost.

A filter gradient sums over the positions (n, oh, ow). TensorFlow's Eigen kernels sum
them image by image; XLA's CPU filter gradient under strict f16 math sums (oh, ow, n),
the batch innermost (docs/identify.md, "Both orders are measured"). The crafted layouts put
term k of a row at position k in (n, oh, ow) order and x a constant, so a kernel that
sums in the other order meets the terms shuffled, and lanes over that order can hide
it from `layer_patterns`' order probe. `BatchInnermost` wraps a backend so that its
filter gradient meets term k k-th in (oh, ow, n) order: every structure probe then
measures in that order unchanged, and confirmation decides between the two orders.
"""

from __future__ import annotations

import numpy as np

from convprobe.identify.rewritten_calls import RewrittenCalls

__all__ = ["BatchInnermost", "batch_innermost_layout"]


def batch_innermost_layout(dy: np.ndarray) -> np.ndarray:
    """dy laid out so that the term at (n, oh, ow)-index k lands at the position whose
    (oh, ow, n)-index is k."""
    n, oh, ow, c = dy.shape
    return np.ascontiguousarray(dy.reshape(oh * ow, n, c).transpose(1, 0, 2).reshape(dy.shape))


class BatchInnermost(RewrittenCalls):
    """`backend` whose filter gradient takes its dy rows in (oh, ow, n) order. Valid only
    where x is one constant and only taps that read inside the image are read (the column
    layout on the VALID proxy, the crafted rows at their spot tap); other ops pass through."""

    rewritten_ops = frozenset({"conv2d_backprop_filter"})

    def rewrite(self, name: str, args: tuple, kwargs: dict) -> tuple[str, tuple, dict]:
        x, dy, *rest = args
        x = np.asarray(x)
        if x.size and not np.all(x == x.flat[0]):
            raise ValueError("BatchInnermost lays out dy only: x must be one constant")
        return name, (x, batch_innermost_layout(np.asarray(dy)), *rest), kwargs
