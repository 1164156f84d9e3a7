"""`dot`: reductions along the last axis under a model.

Inputs are prepared as for the convolutions (`convprobe.emulation.inputs`). Where the
leading axes broadcast as a matrix product (a's rows against b's rows, a's axes first),
`dot` is the GEMM of a 1x1 convolution and takes the convolutions' kernels
(`conv.gemm`); otherwise each row is reduced on its own.
"""

from __future__ import annotations

import math

import numpy as np

from convprobe.emulation import conv, plan
from convprobe.emulation.inputs import as_carrier, finish, fp16_or_narrower, numeric_array
from convprobe.emulation.models import AccumulationModel, kernel_config
from convprobe.errors import InvalidArgument

__all__ = ["dot"]

def _reduced_shapes(a_shape: tuple, b_shape: tuple) -> tuple[tuple[int, ...], int]:
    """(the broadcast leading shape, K) of a reduction along the last axes."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise InvalidArgument("a and b must have at least one axis to reduce")
    if a_shape[-1] != b_shape[-1]:
        raise InvalidArgument(f"a and b must have the same last axis length; received "
                              f"{a_shape[-1]} and {b_shape[-1]}")
    try:
        return np.broadcast_shapes(a_shape[:-1], b_shape[:-1]), a_shape[-1]
    except ValueError:
        raise InvalidArgument(f"a and b leading shapes must broadcast; received "
                              f"{a_shape[:-1]} and {b_shape[:-1]}") from None


#: The fewest rows of a and of b at which a matrix product goes to the GEMM kernels: with
#: fewer, a program's row kernel is faster (`benchmarks/bench_dot.py` measures both; a
#: block-FMA model, whose rows run in NumPy, takes the GEMM at any size).
_GEMM_MIN_SIDE = 4


def _matrix_product(a_shape: tuple, b_shape: tuple, lead: tuple) -> tuple[int, int] | None:
    """(A, B) where the broadcast is a's A rows against b's B rows, a's axes first (the
    result's flat index is i * B + j), else None."""
    def padded(shape):
        return (1,) * (len(lead) - len(shape) + 1) + tuple(shape[:-1])

    a_lead, b_lead = padded(a_shape), padded(b_shape)
    for split in range(len(lead) + 1):
        if (a_lead[:split] == lead[:split] and b_lead[split:] == lead[split:]
                and set(a_lead[split:]) <= {1} and set(b_lead[:split]) <= {1}):
            return math.prod(lead[:split]), math.prod(lead[split:])
    return None


def _rows(x: np.ndarray, lead: tuple[int, ...], k: int) -> np.ndarray:
    """x broadcast to (*lead, k), as C-contiguous rows."""
    return np.ascontiguousarray(np.broadcast_to(x, (*lead, k))).reshape(-1, k)


def dot(a: np.ndarray, b: np.ndarray, model: AccumulationModel,
        c: np.ndarray | None = None) -> np.ndarray:
    """Reduce ``c + a * b`` along the last axis, in index order, under `model`.

    Leading axes broadcast (c's too); the result has the broadcast leading shape and the
    model's output dtype. `c`, the accumulator input of D = A.B + C, needs a block-FMA
    model (tensor cores); it is rounded to the accumulator first. Stochastic rounding is
    keyed by the flat (C-order) index of each result. A matrix product (a (M, 1, K)
    against b (N, K), or b (K,)) runs on the convolutions' GEMM kernels.
    """
    kernel_config(model)
    model.check_dot()
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        raise InvalidArgument(f"a and b must have at least one axis to reduce; received shapes "
                              f"{np.shape(a)} and {np.shape(b)}")
    lead, k = _reduced_shapes(np.shape(a), np.shape(b))
    product = None if c is not None else _matrix_product(np.shape(a), np.shape(b), lead)
    if product is not None and (min(product) >= _GEMM_MIN_SIDE or not model.plannable()):
        rows, columns = product
        return conv.gemm(np.reshape(a, (rows, k)), np.reshape(b, (columns, k)), model).reshape(lead)
    narrow = fp16_or_narrower(a, b)
    if c is None and narrow and model.plannable():
        # the model's kernel program on fp16 values as they are (F16C widens them in the kernel)
        a16, b16 = (np.asarray(x).astype(np.float16, copy=False) for x in (a, b))
        with np.errstate(invalid="ignore"):  # (NaN operands: carried, not an error)
            out = plan.run_rows(model.program(k), _rows(a16, lead, k), _rows(b16, lead, k))
        return finish(out.reshape(lead), model)
    a, b = numeric_array(a, "a"), numeric_array(b, "b")
    rows = int(np.prod(lead, dtype=np.int64))
    cc = None
    if c is not None:
        c64 = numeric_array(c, "c").astype(np.float64)
        try:
            cc = np.ascontiguousarray(np.broadcast_to(c64, lead)).reshape(rows)
        except ValueError:
            raise InvalidArgument(f"c must broadcast to the result shape {lead}; received "
                                  f"shape {c64.shape}") from None
    carrier = np.float64 if c is not None else model.dot_carrier(narrow)
    ac, bc = as_carrier(a, "a", model, narrow, carrier), as_carrier(b, "b", model, narrow, carrier)
    out = model.dot_rows(_rows(ac, lead, k), _rows(bc, lead, k), cc)
    return finish(out.reshape(lead), model)
