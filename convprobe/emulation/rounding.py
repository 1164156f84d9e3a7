"""Rounding a float64 array to any format, in any supported mode.

The option sets are closed and validated here once; the arithmetic is
`_kernel_arithmetic.round_parts`, shared with every accumulation model.

Definitions (identical in the oracle):

* ``nearest_even``: IEEE 754 roundTiesToEven.
* ``toward_zero``: truncation.
* ``stochastic``: round away from zero iff ``floor(f * 2**R) + r >= 2**R``, where
  ``f`` is the discarded fraction of an ulp and ``r`` a uniform R-bit integer,
  ``R = stochastic_bits(fmt)`` by default (24 - p up to 11 bits of precision, else
  min(32, 51 - p); `convprobe.random_stream`), or ``rbits``. The expectation of the result is the
  exact value whenever f has at most R bits, otherwise it falls short by less than
  ``2**-R`` ulp.
* ``subnormals="flush"``: a nonzero result below ``2**emin`` after rounding with
  unbounded exponent becomes a zero of the same sign (flush to zero; inputs are
  never flushed).
* ``overflow="inf"``: a result above the format's max after rounding with
  unbounded exponent becomes inf (NaN for formats without inf, such as
  fp8_e4m3) in every rounding mode, as tensor cores do; ``"saturate"`` clamps
  finite results to +-max (infinite operands stay infinite).
"""

from __future__ import annotations

import numpy as np

from convprobe import random_stream
from convprobe.emulation import _kernels as K
from convprobe.errors import InvalidArgument, invalid_choice, is_integer
from convprobe.formats import FP16, Format, custom_format, parse_format
from convprobe.options import ROUNDING_ALIASES, Overflow, Rounding, Subnormals

__all__ = [
    "ROUNDINGS",
    "SUBNORMALS",
    "OVERFLOWS",
    "Rounding",
    "round_to_format",
    "resolve_format",
    "stochastic_bits",
    "check_rbits",
    "check_choice",
    "MODE_CODES",
]

ROUNDINGS: tuple[str, ...] = tuple(Rounding)
SUBNORMALS: tuple[str, ...] = tuple(Subnormals)
OVERFLOWS: tuple[str, ...] = tuple(Overflow)
_ROUNDING_ALIASES = ROUNDING_ALIASES
# the kernels' integer mode codes, by name (not by position in an option tuple)
MODE_CODES: dict[str, int] = {Rounding.NEAREST_EVEN: K.NEAREST_EVEN, Rounding.TOWARD_ZERO: K.TOWARD_ZERO,
              Rounding.STOCHASTIC: K.STOCHASTIC}
_CUSTOM_PREFIX = "p"
_NARROW_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def check_choice(argument: str, value: object, choices: tuple[str, ...],
                 aliases: dict[str, str] | None = None) -> str:
    """Return the canonical member of a closed option set or raise the standard error."""
    key = str(value).strip().lower() if isinstance(value, str) else value
    if aliases and key in aliases:
        key = aliases[key]
    if key not in choices:
        raise invalid_choice(argument, value, choices)
    return str(key)


def resolve_format(value: str | Format, argument: str) -> Format:
    """A `Format` from a Format, a registered name/alias, or ``p<precision>_emax<emax>``."""
    if isinstance(value, Format):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text.startswith(_CUSTOM_PREFIX) and "_emax" in text:
            prec, _, emax = text[1:].partition("_emax")
            try:
                return custom_format(int(prec), int(emax))
            except ValueError as exc:
                if isinstance(exc, InvalidArgument):
                    raise InvalidArgument(f"{argument}: {exc}") from None
                raise InvalidArgument(
                    f"{argument} custom format must look like p11_emax15; received {value!r}"
                ) from None
    try:
        return parse_format(value, argument=argument)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{exc} (or a custom format p<precision>_emax<emax>)") from None


def stochastic_bits(fmt: Format) -> int:
    """R, the random bits per stochastic rounding to `fmt` (`convprobe.random_stream`):
    24 - p up to 11 bits of precision, else min(32, 51 - p). Never above 51 - p, which
    keeps the round-to-odd sum (53 bits) two bits wider than the rounding point plus R,
    so the bits stochastic rounding inspects are exact."""
    return random_stream.default_bits(fmt.precision)


def check_rbits(rbits: object, fmt: Format, rounding: str = Rounding.STOCHASTIC, where: str = "") -> int:
    """R for stochastic rounding to `fmt` (`where` names its slot in a model): `rbits`
    checked against 1 .. `random_stream.max_bits`, or the default `stochastic_bits(fmt)`
    where it is None; `rbits` without stochastic rounding is refused."""
    shown = int(rbits) if isinstance(rbits, np.integer) else rbits
    if rounding != Rounding.STOCHASTIC and rbits is not None:
        raise InvalidArgument(f"rbits needs rounding=stochastic; received rbits={shown!r} with rounding={rounding}")
    if rbits is None:
        return stochastic_bits(fmt)
    top = random_stream.max_bits(fmt.precision)
    if not is_integer(rbits) or not 1 <= rbits <= top:
        raise InvalidArgument(f"rbits must be an integer from 1 to {top} for {where}{fmt.name}; received {shown!r}")
    return int(rbits)


def format_row(fmt: Format | None, subnormals: str) -> np.ndarray:
    """A row of the kernels' format table, columns `_kernels.F_*` (all zero: exact)."""
    row = np.zeros(K.F_SIZE)
    if fmt is None:
        return row
    row[K.F_PRECISION], row[K.F_EMIN], row[K.F_MAX] = fmt.precision, fmt.emin, fmt.max
    row[K.F_HAS_INF] = float(fmt.has_inf)
    row[K.F_KEEP_SUB] = float(fmt.subnormals and subnormals == "keep")
    return row


def round_to_format(
    values: np.ndarray,
    fmt: str | Format,
    rounding: Rounding | str = "nearest_even",
    *,
    subnormals: Subnormals | str = "keep",
    overflow: Overflow | str = "inf",
    rng: np.random.Generator | int | None = None,
    rbits: int | None = None,
) -> np.ndarray:
    """Round every value (taken exactly as a float64) to `fmt`; returns float64.

    `rng` (a Generator or an int seed) is required for stochastic rounding and
    supplies one R-bit integer per element, in C order; R is `rbits`, by default
    `stochastic_bits(fmt)`.
    """
    fmt = resolve_format(fmt, "fmt")
    rounding = check_choice("rounding", rounding, ROUNDINGS, _ROUNDING_ALIASES)
    subnormals = check_choice("subnormals", subnormals, SUBNORMALS)
    overflow = check_choice("overflow", overflow, OVERFLOWS)
    x = np.asarray(values)
    if x.dtype.kind not in "fiub" and x.dtype.name not in _NARROW_DTYPES:
        raise InvalidArgument(f"values must be numbers (a numeric array); received dtype {x.dtype}")
    if x.dtype.kind not in "fiu":
        x = x.astype(np.float64)
    x = np.ascontiguousarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    if rounding != "stochastic":
        check_rbits(rbits, fmt, rounding)
        if _hardware_fp16(fmt, rounding, subnormals, overflow):
            with np.errstate(over="ignore"):
                return x.astype(np.float16).astype(np.float64)
        r, rbits = np.zeros(flat.shape, dtype=np.int64), 1
    else:
        if fmt.precision > 50:
            raise InvalidArgument(
                f"stochastic rounding needs a format precision of at most 50 bits; "
                f"received {fmt.name} with {fmt.precision}"
            )
        if rng is None:
            raise InvalidArgument("rng must be a numpy Generator or an int seed for "
                                  "stochastic rounding; received None")
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        rbits = check_rbits(rbits, fmt)
        r = gen.integers(0, 1 << rbits, size=flat.shape, dtype=np.int64)
    return _kernel_rounding(flat, fmt, rounding, subnormals, overflow, r, rbits).reshape(x.shape)


def _hardware_fp16(fmt: Format, rounding, subnormals, overflow) -> bool:
    """Whether NumPy's own float64 -> float16 conversion is this rounding: IEEE's, nearest
    even, subnormals kept, overflow to inf, rounded once from the float64 value (tested
    against `_kernel_rounding` at every fp16 value, midpoint and its neighbours). It runs
    several times faster than the general kernel on a model's fp16 outputs."""
    return fmt == FP16 and rounding == Rounding.NEAREST_EVEN and subnormals == "keep" and overflow == "inf"


def _kernel_rounding(flat, fmt, rounding, subnormals, overflow, r, rbits) -> np.ndarray:
    """The general rounding kernel (`_kernels.round_array`) over a flat float64 array."""
    row = format_row(fmt, subnormals)
    out = np.empty_like(flat)
    K.round_array(flat, out, int(row[K.F_PRECISION]), int(row[K.F_EMIN]), row[K.F_MAX], bool(row[K.F_HAS_INF]),
                  bool(row[K.F_KEEP_SUB]),
                  MODE_CODES[Rounding(rounding)], overflow == "saturate", r, rbits)
    return out
