"""Every op as a batch of dot products: `reduce_rows(backend, op, a, b)`.

The fingerprint battery and `identify` need one thing from an op: M independent
sums sum_k a[m, k] * b[k] of length L whose terms sit at known positions along
the op's reduction axis. Each op gets its own embedding, chosen so that the
reduction runs over the axis that op really contracts:

- conv2d: x (M, 1, 1, L) NHWC, w (1, 1, L, 1) - over input channels;
- conv2d_spatial: x (M, 1, L, 1), w (1, L, 1, 1) - over the filter width (the
  65519 test's layout);
- conv2d_backprop_input: dy (M, 1, 1, L), w (1, 1, 1, L) - over output channels;
- conv2d_backprop_input_spatial: dy (M, 1, L, 1) reversed, w (1, L, 1, 1), dx
  width 2L - 1, read at L - 1 - over the filter width (costs M L (2L - 1):
  `QUADRATIC_LIMIT` caps L);
- conv2d_backprop_filter: x (1, 1, L, M), dy (1, 1, L, 1) - over the width
  (batch x spatial positions are what a filter gradient sums);
- depthwise_conv2d: x (M, 1, L, 1), w (1, L, 1, 1) - over the filter width;
- conv3d: x (M, 1, 1, 1, L) NDHWC, w (1, 1, 1, L, 1) - over input channels;
- matmul: (M, L) @ (L, 1); einsum: 'mk,k->m'.
"""

from __future__ import annotations

import numpy as np

from convprobe.errors import UnsupportedConfiguration, invalid_choice

__all__ = ["OPS", "CONV2D_OPS", "QUADRATIC_LIMIT", "QUADRATIC_OPS", "base_op", "check_ops", "reduce_rows"]

#: Every op the battery knows, in table order. `_spatial` variants reduce over the
#: filter width instead of channels: the same kernel can accumulate differently.
OPS = (
    "conv2d", "conv2d_spatial", "conv2d_backprop_input", "conv2d_backprop_input_spatial",
    "conv2d_backprop_filter", "depthwise_conv2d", "conv3d", "matmul", "einsum",
)
#: The ops of a conv2d layer's forward and backward pass.
CONV2D_OPS = OPS[:5]
#: Longest row an op whose cost grows as L**2 is given.
QUADRATIC_LIMIT = 1024
QUADRATIC_OPS = frozenset({"conv2d_backprop_input_spatial"})


def base_op(op: str) -> str:
    """The backend method behind an op name ('conv2d_spatial' -> 'conv2d')."""
    return op.removesuffix("_spatial")


def check_ops(ops) -> tuple[str, ...]:
    """Validate op names (a list, or 'all'); returns them in the caller's order."""
    if isinstance(ops, str):
        ops = OPS if ops == "all" else [o.strip() for o in ops.split(",") if o.strip()]
    out = []
    for op in ops:
        if op not in OPS:
            raise invalid_choice("op", op, (*OPS, "all"))
        out.append(op)
    if not out:
        raise invalid_choice("op", "", (*OPS, "all"))
    return tuple(dict.fromkeys(out))


def reduce_rows(backend, op: str, a: np.ndarray, b: np.ndarray, channel: np.ndarray | None = None) -> np.ndarray:
    """out[m] = sum_k a[m, k] * b[channel[m], k], computed by `backend`'s `op` (fp16 in and out).

    `b` is one filter vector (L,) or several (C, L); with several, each op gets
    C output channels (filters, matmul columns, depthwise multipliers) and row m
    reads channel[m]: one call, hence one XLA compilation, serves every filter.
    """
    if base_op(op) not in getattr(backend, "capabilities", ()):
        raise UnsupportedConfiguration(f"{backend.name} does not implement {base_op(op)}")
    a = np.ascontiguousarray(a, dtype=np.float16)
    bs = np.ascontiguousarray(np.atleast_2d(b), dtype=np.float16)
    m, length = a.shape
    c = bs.shape[0]
    channel = np.zeros(m, dtype=np.int64) if channel is None else np.asarray(channel, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        if op == "conv2d":
            y = backend.conv2d(a.reshape(m, 1, 1, length), bs.T.reshape(1, 1, length, c))
        elif op == "conv2d_spatial":
            y = backend.conv2d(a.reshape(m, 1, length, 1), bs.T.reshape(1, length, 1, c))
        elif op == "conv2d_backprop_input":
            y = backend.conv2d_backprop_input(a.reshape(m, 1, 1, length), bs.reshape(1, 1, c, length), (m, 1, 1, c))
        elif op == "conv2d_backprop_input_spatial":
            if length > QUADRATIC_LIMIT:
                raise UnsupportedConfiguration(f"{op} is limited to rows of {QUADRATIC_LIMIT} (cost grows as L**2)")
            dy = np.ascontiguousarray(a[:, ::-1]).reshape(m, 1, length, 1)
            w = np.ascontiguousarray(bs.T).reshape(1, length, c, 1)
            dx = backend.conv2d_backprop_input(dy, w, (m, 1, 2 * length - 1, c))
            y = np.asarray(dx)[:, :, length - 1, :]
        elif op == "conv2d_backprop_filter":
            x = np.ascontiguousarray(a.T).reshape(1, 1, length, m)
            y = backend.conv2d_backprop_filter(x, np.ascontiguousarray(bs.T).reshape(1, 1, length, c), (1, 1, m, c))
        elif op == "depthwise_conv2d":
            y = backend.depthwise_conv2d(a.reshape(m, 1, length, 1), np.ascontiguousarray(bs.T).reshape(1, length, 1, c))
        elif op == "conv3d":
            y = backend.conv3d(a.reshape(m, 1, 1, 1, length), np.ascontiguousarray(bs.T).reshape(1, 1, 1, length, c))
        elif op == "matmul":
            y = backend.matmul(a, np.ascontiguousarray(bs.T))
        elif op == "einsum":
            y = backend.einsum("mk,kc->mc", a, np.ascontiguousarray(bs.T))
        else:
            raise invalid_choice("op", op, OPS)
    y = np.asarray(y).reshape(m, c)
    return y[np.arange(m), channel]
