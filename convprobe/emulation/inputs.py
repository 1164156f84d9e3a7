"""Input preparation shared by `dot` and the convolutions: the carrier dtype a kernel takes,
and the checks that every product is exact and every value fits the model's formats.

Inputs are converted exactly: fp16 and fp8 values straight to a float16 or float32
carrier where a kernel takes one, anything else to float64 first. Products must be exact
in float64 (every model, bar ``product=fp64``, starts from the exact product):
that holds for fp8/fp16/bf16/fp32 inputs. float64 inputs are accepted when each
value has at most 26 significand bits and magnitude in [2**-511, 2**511] (or is
zero or non-finite); otherwise `InvalidArgument` says so rather than silently
rounding a product.
"""

from __future__ import annotations

import numpy as np

from convprobe.emulation.models import AccumulationModel, as_format
from convprobe.errors import InvalidArgument
from convprobe.formats import FP64
from convprobe.options import Zeros

__all__ = ["as_carrier", "as_float64", "check_exact_products", "finish", "fp16_or_narrower", "numeric_array",
           "NARROW_DTYPES"]

#: The dtypes of formats of at most 24 significand bits (their products are exact in float64).
NARROW_DTYPES = ("float16", "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2")
_FP16_OR_NARROWER = ("float16", "float8_e4m3fn", "float8_e5m2")


def fp16_or_narrower(*arrays) -> bool:
    """Whether every array's dtype holds only fp16-representable values."""
    return all(np.asarray(a).dtype.name in _FP16_OR_NARROWER for a in arrays)


def numeric_array(x: object, argument: str) -> np.ndarray:
    """`x` as an array; refuses a non-numeric dtype."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and arr.dtype.name not in NARROW_DTYPES:
        raise InvalidArgument(f"{argument} must be a numeric array; received dtype {arr.dtype}")
    return arr


def as_float64(x: object, argument: str) -> tuple[np.ndarray, bool]:
    """(`x` as a C-contiguous float64 array with values unchanged, whether its dtype is a
    format of at most 24 significand bits); rejects non-numeric input."""
    arr = numeric_array(x, argument)
    return np.ascontiguousarray(arr, dtype=np.float64), arr.dtype.name in NARROW_DTYPES


def as_carrier(x: object, argument: str, model: AccumulationModel, narrow: bool, carrier: type) -> np.ndarray:
    """`x` checked (exact products, the model's input format) and C-contiguous in `carrier`,
    the dtype a kernel takes. `narrow`: every operand holds only fp16-representable values;
    then x goes to a float16 or float32 carrier directly (exact), without the float64 copy
    that the checks of wider inputs need (for `dot`'s rows, that copy cost more than the
    block-FMA kernel itself)."""
    if narrow and carrier != np.float64:
        arr: np.ndarray = np.ascontiguousarray(numeric_array(x, argument), carrier)
        check_exact_products(arr, True, model, argument)
        model.check_inputs(arr, True, argument)
        return arr
    x64, fits = as_float64(x, argument)
    check_exact_products(x64, fits, model, argument)
    model.check_inputs(x64, fp16_or_narrower(x), argument)
    return x64 if carrier == np.float64 else x64.astype(carrier)  # (exact: `carrier` holds the model's inputs)


def check_exact_products(x64: np.ndarray, narrow: bool, model: AccumulationModel,
                         argument: str) -> None:
    """Raise unless every product involving x64 is exact in float64 (see module doc),
    or if x64 holds infinities that a format of the model cannot represent."""
    if x64.size and np.isinf(x64).any():
        for fmt, role in ((as_format(model.accumulator), "accumulator"), (as_format(model.output), "output")):
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
    format's storage dtype; under ``zeros=positive`` added onto +0, as the kernel does (only a
    -0 changes: +0 + -0 = +0)."""
    out = out64.astype(model.output_dtype, copy=False)
    if model.zeros == Zeros.POSITIVE:
        return out + out.dtype.type(0)
    return out
