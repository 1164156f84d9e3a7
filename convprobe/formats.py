"""Number formats: exact constants, aliases and parsing.

One frozen `Format` per format. Constants are written as hex literals so they are
exact; they are checked against `ml_dtypes.finfo`/`numpy.finfo` in the tests.
The default loss scale per format follows the reference ResNet's fp16 support
(fp16 -> 128, everything else -> 1; tensorflow/models PR #3687).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from convprobe.errors import InvalidArgument, invalid_choice

__all__ = [
    "Format",
    "FORMATS",
    "FP8_E4M3",
    "FP8_E5M2",
    "BF16",
    "FP16",
    "TF32",
    "FP32",
    "FP64",
    "parse_format",
    "format_of_dtype",
    "custom_format",
]


@dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    `precision` counts the significand bits including the implicit one, so the
    unit roundoff is u = 2**-precision. `emin` is the exponent of the smallest
    normal number; `emax` that of the largest finite one.
    """

    name: str
    bits: int
    precision: int
    emin: int
    emax: int
    max: float
    has_inf: bool = True
    subnormals: bool = True
    dtype_name: str | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)
    default_loss_scale: float = field(default=1.0, compare=False)

    @property
    def unit_roundoff(self) -> float:
        """u = 2**-p: the relative error bound of round-to-nearest."""
        return math.ldexp(1.0, -self.precision)

    @property
    def epsilon(self) -> float:
        """Machine epsilon 2**(1-p): the gap from 1 to the next number."""
        return math.ldexp(1.0, 1 - self.precision)

    @property
    def tiny(self) -> float:
        """Smallest positive normal number, 2**emin."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive number: 2**(emin - p + 1), or `tiny` without subnormals."""
        if not self.subnormals:
            return self.tiny
        return math.ldexp(1.0, self.emin - self.precision + 1)

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype storing this format (bf16/fp8 via ml_dtypes)."""
        if self.dtype_name is None:
            raise InvalidArgument(f"format {self.name} has no NumPy storage dtype")
        if self.dtype_name in ("float16", "float32", "float64"):
            return np.dtype(self.dtype_name)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self.dtype_name))

    def holds(self, other: Format) -> bool:
        """Whether every finite value of `other` is a value of this format (so inputs
        stored in `other` need no check against this one)."""
        return (self.precision >= other.precision and self.max >= other.max
                and self.emin - self.precision <= other.emin - other.precision
                and (self.subnormals or other.smallest_subnormal >= self.tiny))

    def __str__(self) -> str:
        return self.name


FP8_E4M3 = Format(
    "fp8_e4m3", bits=8, precision=4, emin=-6, emax=8, max=float.fromhex("0x1.cp8"),
    has_inf=False, dtype_name="float8_e4m3fn", aliases=("float8_e4m3", "float8_e4m3fn", "e4m3"),
)
FP8_E5M2 = Format(
    "fp8_e5m2", bits=8, precision=3, emin=-14, emax=15, max=float.fromhex("0x1.cp15"),
    dtype_name="float8_e5m2", aliases=("float8_e5m2", "e5m2"),
)
BF16 = Format(
    "bf16", bits=16, precision=8, emin=-126, emax=127, max=float.fromhex("0x1.fep127"),
    dtype_name="bfloat16", aliases=("bfloat16",),
)
FP16 = Format(
    "fp16", bits=16, precision=11, emin=-14, emax=15, max=float.fromhex("0x1.ffcp15"),
    dtype_name="float16", aliases=("float16", "half"), default_loss_scale=128.0,
)
# NVIDIA's TensorFloat-32: fp32's range with fp16's 10 fraction bits, carried in float32
# storage (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020, "TF32").
TF32 = Format(
    "tf32", bits=19, precision=11, emin=-126, emax=127, max=float.fromhex("0x1.ffcp127"),
    aliases=("tensorfloat32", "tensorfloat-32"),
)
FP32 = Format(
    "fp32", bits=32, precision=24, emin=-126, emax=127, max=float.fromhex("0x1.fffffep127"),
    dtype_name="float32", aliases=("float32", "single"),
)
FP64 = Format(
    "fp64", bits=64, precision=53, emin=-1022, emax=1023,
    max=float.fromhex("0x1.fffffffffffffp1023"), dtype_name="float64",
    aliases=("float64", "double"),
)

FORMATS: dict[str, Format] = {
    f.name: f for f in (FP8_E4M3, FP8_E5M2, BF16, FP16, TF32, FP32, FP64)
}
_BY_ALIAS: dict[str, Format] = {
    alias: f for f in FORMATS.values() for alias in (f.name, *f.aliases)
}


def parse_format(
    value: str | Format, *, argument: str = "format", allowed: tuple[str, ...] | None = None
) -> Format:
    """Return the `Format` named by `value` (a canonical name or an alias).

    `allowed` narrows the accepted canonical names (a trainer may take only
    fp16/bf16/fp32); the error names `argument` and lists what is valid.
    """
    names = tuple(allowed) if allowed is not None else tuple(FORMATS)
    fmt: Format | None
    if isinstance(value, Format):
        fmt = value
    else:
        fmt = _BY_ALIAS.get(str(value).strip().lower())
    if fmt is None or fmt.name not in names:
        raise invalid_choice(argument, value, names)
    return fmt


def format_of_dtype(dtype: np.dtype | type) -> Format:
    """The `Format` whose storage dtype is `dtype`."""
    dt = np.dtype(dtype)
    stored = [fmt for fmt in FORMATS.values() if fmt.dtype_name is not None]
    for fmt in stored:
        if fmt.dtype == dt:
            return fmt
    raise invalid_choice("dtype", str(dt), [f.dtype.name for f in stored])


def custom_format(
    precision: int, emax: int, *, subnormals: bool = True, has_inf: bool = True,
    name: str | None = None,
) -> Format:
    """An IEEE-style "what if" format with `precision` significand bits and range emax.

    Values are carried in float64, so precision must be at most 53 and the range
    must fit inside binary64's.
    """
    if not isinstance(precision, int) or not 2 <= precision <= 53:
        raise InvalidArgument(f"precision must be an integer in [2, 53]; received {precision!r}")
    if not isinstance(emax, int) or not 1 <= emax <= 1023:
        raise InvalidArgument(f"emax must be an integer in [1, 1023]; received {emax!r}")
    largest = math.ldexp(2.0 - math.ldexp(1.0, 1 - precision), emax)
    return Format(
        name or f"p{precision}_emax{emax}", bits=0, precision=precision, emin=1 - emax,
        emax=emax, max=largest, has_inf=has_inf, subnormals=subnormals,
    )
