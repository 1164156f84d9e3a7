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
from convprobe.options import names_or_all

__all__ = [
    "OPS", "BATTERY_OP_SEEDS", "CONV2D_OPS", "QUADRATIC_LIMIT", "QUADRATIC_OPS", "base_op", "check_ops", "op_call", "reduce_rows",
    "reduce_many",
]

#: Every op the battery knows, in table order. `_spatial` variants reduce over the
#: filter width instead of channels: the same kernel can accumulate differently.
OPS = (
    "conv2d", "conv2d_spatial", "conv2d_backprop_input", "conv2d_backprop_input_spatial",
    "conv2d_backprop_filter", "depthwise_conv2d", "conv3d", "matmul", "einsum",
)
#: Each op's seed stream, keyed by name: adding an op or reordering the table changes no
#: other op's inputs.
BATTERY_OP_SEEDS = {"conv2d": 0, "conv2d_spatial": 1, "conv2d_backprop_input": 2, "conv2d_backprop_input_spatial": 3,
                    "conv2d_backprop_filter": 4, "depthwise_conv2d": 5, "conv3d": 6, "matmul": 7, "einsum": 8}
#: The ops of a conv2d layer's forward and backward pass.
CONV2D_OPS = OPS[:5]
#: Longest row an op whose cost grows as L**2 is given.
QUADRATIC_LIMIT = 1024
QUADRATIC_OPS = frozenset({"conv2d_backprop_input_spatial"})


def base_op(op: str) -> str:
    """The backend method behind an op name ('conv2d_spatial' -> 'conv2d')."""
    return op.removesuffix("_spatial")


def check_ops(ops) -> tuple[str, ...]:
    """Validate op names (a comma list, a list, or 'all'); returns them in the caller's order."""
    return names_or_all(ops, OPS, "op")


def op_call(op: str, a: np.ndarray, b: np.ndarray, channel: np.ndarray | None = None):
    """(backend method, args, kwargs, post) computing out[m] = sum_k a[m, k] b[channel[m], k].

    `b` is one filter vector (L,) or several (C, L); with several, each op gets
    C output channels (filters, matmul columns, depthwise multipliers) and row m
    reads channel[m]. `post(raw)` turns the method's output into the (M,) rows.
    """
    a = np.ascontiguousarray(a, dtype=np.float16)
    bs = np.ascontiguousarray(np.atleast_2d(b), dtype=np.float16)
    m, length = a.shape
    c = bs.shape[0]
    rows = np.arange(m)
    channel = np.zeros(m, dtype=np.int64) if channel is None else np.asarray(channel, dtype=np.int64)
    filters = np.ascontiguousarray(bs.T)  # (L, C)

    def pick(raw):
        return np.asarray(raw).reshape(m, c)[rows, channel]

    if op == "conv2d":
        return "conv2d", (a.reshape(m, 1, 1, length), filters.reshape(1, 1, length, c)), {}, pick
    if op == "conv2d_spatial":
        return "conv2d", (a.reshape(m, 1, length, 1), filters.reshape(1, length, 1, c)), {}, pick
    if op == "conv2d_backprop_input":
        return "conv2d_backprop_input", (a.reshape(m, 1, 1, length), bs.reshape(1, 1, c, length), (m, 1, 1, c)), {}, pick
    if op == "conv2d_backprop_input_spatial":
        if length > QUADRATIC_LIMIT:
            raise UnsupportedConfiguration(f"{op} is limited to rows of {QUADRATIC_LIMIT} (cost grows as L**2)")
        dy = np.ascontiguousarray(a[:, ::-1]).reshape(m, 1, length, 1)

        def pick_middle(raw):
            return np.asarray(raw)[:, 0, length - 1, :][rows, channel]

        return "conv2d_backprop_input", (dy, filters.reshape(1, length, c, 1), (m, 1, 2 * length - 1, c)), {}, pick_middle
    if op == "conv2d_backprop_filter":
        x = np.ascontiguousarray(a.T).reshape(1, 1, length, m)
        return "conv2d_backprop_filter", (x, filters.reshape(1, 1, length, c), (1, 1, m, c)), {}, pick
    if op == "depthwise_conv2d":
        return "depthwise_conv2d", (a.reshape(m, 1, length, 1), filters.reshape(1, length, 1, c)), {}, pick
    if op == "conv3d":
        return "conv3d", (a.reshape(m, 1, 1, 1, length), filters.reshape(1, 1, 1, length, c)), {}, pick
    if op == "matmul":
        return "matmul", (a, filters), {}, pick
    if op == "einsum":
        return "einsum", ("mk,kc->mc", a, filters), {}, pick
    raise invalid_choice("op", op, OPS)


def _check_capability(backend, op: str) -> None:
    if base_op(op) not in getattr(backend, "capabilities", ()):
        raise UnsupportedConfiguration(f"{backend.name} does not implement {base_op(op)}")


def reduce_rows(backend, op: str, a: np.ndarray, b: np.ndarray, channel: np.ndarray | None = None) -> np.ndarray:
    """out[m] = sum_k a[m, k] * b[channel[m], k], computed by `backend`'s `op` (fp16 in and out)."""
    _check_capability(backend, op)
    method, args, kwargs, post = op_call(op, a, b, channel)
    with np.errstate(over="ignore", invalid="ignore"):
        return post(getattr(backend, method)(*args, **kwargs))


def reduce_many(backend, op: str | list[str], requests) -> list[np.ndarray]:
    """`reduce_rows` for several (a, b, channel) requests at once: one compilation under XLA
    when the backend offers `run_together` (TensorFlow), one call each otherwise. `op` is one
    op for every request or a list with one op per request."""
    ops = [op] * len(requests) if isinstance(op, str) else list(op)
    for name in dict.fromkeys(ops):
        _check_capability(backend, name)
    calls = [op_call(name, a, b, channel) for name, (a, b, channel) in zip(ops, requests)]
    with np.errstate(over="ignore", invalid="ignore"):
        if hasattr(backend, "run_together"):
            raws = backend.run_together([(method, args, kwargs) for method, args, kwargs, _ in calls])
        else:
            raws = [getattr(backend, method)(*args, **kwargs) for method, args, kwargs, _ in calls]
    return [post(raw) for (_, _, _, post), raw in zip(calls, raws)]
