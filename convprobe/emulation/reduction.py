"""`dot`: reductions along the last axis under a model, and input preparation.

Inputs of any float dtype are widened to float64 exactly. Products must be exact
in float64 (every model, bar ``product=fp64``, starts from the exact product):
that holds for fp8/fp16/bf16/fp32 inputs. float64 inputs are accepted when each
value has at most 26 significand bits and magnitude in [2**-511, 2**511] (or is
zero or non-finite); otherwise `InvalidArgument` says so rather than silently
rounding a product.
"""

from __future__ import annotations

import numpy as np

from convprobe.emulation import plan
from convprobe.emulation.models import AccumulationModel, kernel_config
from convprobe.errors import InvalidArgument
from convprobe.formats import FP64

__all__ = ["dot", "as_float64", "check_exact_products", "finish"]

_NARROW = ("float16", "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2")


_FP16_OR_NARROWER = ("float16", "float8_e4m3fn", "float8_e5m2")


def fp16_or_narrower(*arrays) -> bool:
    """Whether every array's dtype holds only fp16-representable values."""
    return all(np.asarray(a).dtype.name in _FP16_OR_NARROWER for a in arrays)


def as_float64(x: object, argument: str) -> tuple[np.ndarray, bool]:
    """(`x` as a C-contiguous float64 array with values unchanged, whether its dtype is a
    format of at most 24 significand bits); rejects non-numeric input."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and arr.dtype.name not in _NARROW:
        raise InvalidArgument(f"{argument} must be a numeric array; received dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float64), arr.dtype.name in _NARROW


def check_exact_products(x64: np.ndarray, narrow: bool, model: AccumulationModel,
                         argument: str) -> None:
    """Raise unless every product involving x64 is exact in float64 (see module doc),
    or if x64 holds infinities that a format of the model cannot represent."""
    if x64.size and np.isinf(x64).any():
        for fmt, role in ((model.accumulator, "accumulator"), (model.output, "output")):
            if not fmt.has_inf:
                raise InvalidArgument(
                    f"{argument} contains inf, which the {role} format {fmt.name} cannot "
                    f"represent (it has no infinities); remove them or use a format with inf"
                )
    if narrow or model.product == FP64 or x64.size == 0:
        return
    finite = x64[np.isfinite(x64) & (x64 != 0)]
    mant, exp = np.frexp(finite)
    wide = np.ldexp(mant, 26) != np.trunc(np.ldexp(mant, 26))
    out_of_range = (exp < -510) | (exp > 511)
    if wide.any() or out_of_range.any():
        raise InvalidArgument(
            f"{argument} has float64 values with more than 26 significand bits or magnitude "
            f"outside [2**-511, 2**511]: their products are not exact in float64; cast "
            f"{argument} to float32, or use product=fp64 to round each product"
        )


def finish(out64: np.ndarray, model: AccumulationModel) -> np.ndarray:
    """Results (already representable, in a float64, float32 or float16 carrier) in the output
    format's storage dtype."""
    return out64.astype(model.output_dtype, copy=False)


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


def _rows(x: np.ndarray, lead: tuple[int, ...], k: int) -> np.ndarray:
    """x broadcast to (*lead, k), as C-contiguous rows."""
    return np.ascontiguousarray(np.broadcast_to(x, (*lead, k))).reshape(-1, k)


def dot(a: np.ndarray, b: np.ndarray, model: AccumulationModel,
        c: np.ndarray | None = None) -> np.ndarray:
    """Reduce ``c + a * b`` along the last axis, in index order, under `model`.

    Leading axes broadcast (c's too); the result has the broadcast leading shape and the
    model's output dtype. `c`, the accumulator input of D = A.B + C, needs a block-FMA
    model (tensor cores); it is rounded to the accumulator first. Stochastic rounding is
    keyed by the flat (C-order) index of each result.
    """
    kernel_config(model)
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        raise InvalidArgument(f"a and b must have at least one axis to reduce; received shapes "
                              f"{np.shape(a)} and {np.shape(b)}")
    if c is None and fp16_or_narrower(a, b) and model.plannable():
        # the model's kernel program on fp16 values as they are (F16C widens them in the kernel)
        lead, k = _reduced_shapes(np.shape(a), np.shape(b))
        a16, b16 = (np.asarray(x).astype(np.float16, copy=False) for x in (a, b))
        with np.errstate(invalid="ignore"):  # (NaN operands: carried, not an error)
            out = plan.run_rows(model.program(k), _rows(a16, lead, k), _rows(b16, lead, k))
        return finish(out.reshape(lead), model)
    a64, a_narrow = as_float64(a, "a")
    b64, b_narrow = as_float64(b, "b")
    lead, k = _reduced_shapes(a64.shape, b64.shape)
    check_exact_products(a64, a_narrow, model, "a")
    check_exact_products(b64, b_narrow, model, "b")
    rows = int(np.prod(lead, dtype=np.int64))
    cc = None
    if c is not None:
        c64 = np.asarray(c)
        if c64.dtype.kind not in "fiu" and c64.dtype.name not in _NARROW:
            raise InvalidArgument(f"c must be a numeric array; received dtype {c64.dtype}")
        c64 = c64.astype(np.float64)
        try:
            cc = np.ascontiguousarray(np.broadcast_to(c64, lead)).reshape(rows)
        except ValueError:
            raise InvalidArgument(f"c must broadcast to the result shape {lead}; received "
                                  f"shape {c64.shape}") from None
    out = model.reduce_rows(_rows(a64, lead, k), _rows(b64, lead, k), cc)
    return finish(out.reshape(lead), model)
