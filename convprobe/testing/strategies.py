"""Hypothesis strategies for low-precision numbers and the inputs that break accumulators.

Values are drawn as *encodings* (integers over a format's code points), so
every representable value is reachable with the same probability per code
point - subnormals, the largest finite numbers and both zeros included - and
hypothesis shrinks towards +0. Ranges are exact: for non-negative values the
encoding order is the value order (IEEE 754 §3.4).

    from convprobe.testing.strategies import fp16_arrays, adversarial_dots
    @given(fp16_arrays((4, 8), min_value=-2.0, max_value=2.0))
    @given(adversarial_dots("fp16", kind="swamping"))

`adversarial_dots` draws `DotCase(a, b, exact, kind, note)`: two 1-D arrays in
the format whose dot product stresses an accumulator, and the exact result
(`math.fsum` of the exact float64 products: correctly rounded to float64).
Kinds: cancellation (+M and -M around small terms), swamping (a large first
term then terms below half its ulp), overflow (products or partial sums past
the format's max although the exact sum is small), subnormal (products at the
subnormal boundaries). `DotCase.as_conv()` reshapes a case into a 1x1
convolution (x NHWC 1x1x1xK, w HWIO 1x1xKx1) with one output.

Requires hypothesis (the `test` extra); the plugin does not import this module.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from convprobe.errors import InvalidArgument, invalid_choice, is_integer
from convprobe.formats import Format, parse_format

__all__ = [
    "representable_floats",
    "representable_arrays",
    "fp16_arrays",
    "bf16_arrays",
    "adversarial_dots",
    "boundary_values",
    "DotCase",
    "ADVERSARIAL_KINDS",
]

ADVERSARIAL_KINDS = ("cancellation", "swamping", "overflow", "subnormal")

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _format(fmt: str | Format) -> Format:
    f = parse_format(fmt)
    if f.dtype_name is None:
        raise InvalidArgument(f"fmt must have a NumPy storage dtype; received {f.name}")
    return f


def _code(value: float, fmt: Format) -> int:
    """Encoding of a non-negative representable value."""
    stored = np.array(value, dtype=np.float64).astype(fmt.dtype)
    if float(stored.astype(np.float64)) != value:
        raise InvalidArgument(f"{value!r} is not representable in {fmt.name}")
    return int(stored.reshape(1).view(_UINT[fmt.dtype.itemsize])[0])


def _decode(codes: np.ndarray, fmt: Format) -> np.ndarray:
    return np.asarray(codes, dtype=_UINT[fmt.dtype.itemsize]).view(fmt.dtype)


def _magnitude_range(fmt: Format, low: float, high: float) -> tuple[int, int]:
    """Encodings of the representable magnitudes in [low, high] (low, high >= 0)."""
    rounded_low = float(np.array(low).astype(fmt.dtype).astype(np.float64))
    rounded_high = float(np.array(high).astype(fmt.dtype).astype(np.float64))
    lo = _code(rounded_low, fmt) + (1 if rounded_low < low else 0)
    hi = _code(rounded_high, fmt) - (1 if rounded_high > high else 0)
    if lo > hi:
        raise InvalidArgument(f"no {fmt.name} value lies in [{low!r}, {high!r}]")
    return lo, hi


def _bound(value: object, argument: str) -> float | None:
    """A min_value/max_value: None or a real number that is not NaN (checked when the strategy is
    built, not when hypothesis first draws from it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise InvalidArgument(f"{argument} must be a number or None; received {value!r}")
    return float(value)


def _flags(**flags: object) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be True or False; received {value!r}")


def _shape(shape: object) -> tuple[int, ...] | st.SearchStrategy[tuple[int, ...]]:
    """An array shape: a non-negative integer, a tuple of them, or a strategy of shapes."""
    if isinstance(shape, st.SearchStrategy):
        return shape
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not all(is_integer(d) and d >= 0 for d in dims):
        raise InvalidArgument(f"shape must be a non-negative integer, a tuple of them or a strategy of shapes; "
                              f"received {shape!r}")
    return tuple(int(d) for d in dims)


def _codes(
    fmt: Format, min_value: float | None, max_value: float | None, allow_nan: bool,
    allow_infinity: bool, allow_subnormal: bool,
) -> st.SearchStrategy[int]:
    """Integers that decode to values of `fmt` in [min_value, max_value]."""
    min_value, max_value = _bound(min_value, "min_value"), _bound(max_value, "max_value")
    _flags(allow_nan=allow_nan, allow_infinity=allow_infinity, allow_subnormal=allow_subnormal)
    sign = 1 << (8 * fmt.dtype.itemsize - 1)
    low = -fmt.max if min_value is None else min_value
    high = fmt.max if max_value is None else max_value
    if min_value is not None and max_value is not None and low > high:
        raise InvalidArgument(f"min_value must be <= max_value; received {min_value!r} > {max_value!r}")
    low, high = max(low, -fmt.max), min(high, fmt.max)
    if low > high:  # the range lies beyond the format's finite values
        raise InvalidArgument(f"no finite {fmt.name} value lies in [{min_value!r}, {max_value!r}] (its largest is "
                              f"{fmt.max!r})")
    parts: list[st.SearchStrategy[int]] = []
    if high >= 0:
        lo, hi = _magnitude_range(fmt, max(low, 0.0), high)
        parts.append(st.integers(lo, hi))
    if low < 0:
        lo, hi = _magnitude_range(fmt, max(-high, 0.0), -low)
        parts.append(st.integers(lo, hi).map(lambda c: c | sign))
    if not parts:
        raise InvalidArgument(f"no {fmt.name} value lies in [{low!r}, {high!r}]")
    codes = st.one_of(*parts)
    if not allow_subnormal:
        tiny = _code(fmt.tiny, fmt)
        codes = codes.filter(lambda c: (c & (sign - 1)) == 0 or (c & (sign - 1)) >= tiny)
    extras: list[int] = []
    if allow_infinity and fmt.has_inf:
        inf = _code_inf(fmt)
        if max_value is None:
            extras.append(inf)
        if min_value is None:
            extras.append(inf | sign)
    if allow_nan:
        extras.append(int(np.array(np.nan).astype(fmt.dtype).reshape(1).view(_UINT[fmt.dtype.itemsize])[0]))
    if extras:
        codes = st.one_of(codes, st.sampled_from(extras))
    return codes


def _code_inf(fmt: Format) -> int:
    return int(np.array(np.inf).astype(fmt.dtype).reshape(1).view(_UINT[fmt.dtype.itemsize])[0])


def representable_floats(
    fmt: str | Format = "fp16", *, min_value: float | None = None, max_value: float | None = None,
    allow_nan: bool = False, allow_infinity: bool = False, allow_subnormal: bool = True,
) -> st.SearchStrategy[float]:
    """Python floats exactly representable in `fmt`, drawn uniformly over its encodings."""
    f = _format(fmt)
    return _codes(f, min_value, max_value, allow_nan, allow_infinity, allow_subnormal).map(
        lambda c: float(_decode(np.array([c]), f)[0])
    )


def representable_arrays(
    fmt: str | Format, shape, *, min_value: float | None = None, max_value: float | None = None,
    allow_nan: bool = False, allow_infinity: bool = False, allow_subnormal: bool = True,
    unique: bool = False,
) -> st.SearchStrategy[np.ndarray]:
    """Arrays in `fmt`'s storage dtype (float16, ml_dtypes.bfloat16, float8_*) with the given shape.

    `shape` is an int, a tuple or a strategy of shapes (e.g.
    `hypothesis.extra.numpy.array_shapes()`).
    """
    f = _format(fmt)
    codes = _codes(f, min_value, max_value, allow_nan, allow_infinity, allow_subnormal)
    _flags(unique=unique)
    uint = np.dtype(_UINT[f.dtype.itemsize])
    return hnp.arrays(uint, _shape(shape), elements=codes, unique=unique).map(lambda c: _decode(c, f))


def fp16_arrays(shape, **kwargs) -> st.SearchStrategy[np.ndarray]:
    """float16 arrays; keyword arguments as `representable_arrays`."""
    return representable_arrays("fp16", shape, **kwargs)


def bf16_arrays(shape, **kwargs) -> st.SearchStrategy[np.ndarray]:
    """bfloat16 (ml_dtypes) arrays; keyword arguments as `representable_arrays`."""
    return representable_arrays("bf16", shape, **kwargs)


def boundary_values(fmt: str | Format = "fp16") -> st.SearchStrategy[float]:
    """The values where formats misbehave: ±0, the smallest subnormal and its neighbours,
    the largest subnormal, the smallest normal, 1 and its neighbours, the largest finite
    number, and the values halfway between (ties, as float64), each with either sign."""
    f = _format(fmt)
    sub, tiny, eps = f.smallest_subnormal, f.tiny, f.epsilon
    values = [
        0.0, sub, 2 * sub, sub / 2, 1.5 * sub, tiny - sub, tiny, tiny - sub / 2, tiny + sub,
        1.0, 1.0 + eps, 1.0 - eps / 2, 1.0 - eps / 4, 1.0 + eps / 2, f.max, f.max - math.ldexp(1.0, f.emax - f.precision + 1),
        f.max + math.ldexp(1.0, f.emax - f.precision),
    ]
    return st.sampled_from(values).flatmap(lambda v: st.sampled_from([v, -v]))


@dataclass(frozen=True)
class DotCase:
    """A dot product chosen to stress an accumulator, with its exact value."""

    a: np.ndarray
    b: np.ndarray
    exact: float
    kind: str
    note: str

    @property
    def K(self) -> int:
        return int(self.a.shape[0])

    def as_conv(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, w) for a 1x1 convolution with one output equal to this dot product."""
        return self.a.reshape(1, 1, 1, -1), self.b.reshape(1, 1, -1, 1)


def _exact(a: np.ndarray, b: np.ndarray) -> float:
    """sum a_k b_k correctly rounded to float64 (each product is exact in float64)."""
    return math.fsum(float(x) * float(y) for x, y in zip(a.astype(np.float64), b.astype(np.float64)))


def _case(f: Format, a: list[float], b: list[float], kind: str, note: str) -> DotCase:
    a_arr = np.array(a, dtype=np.float64).astype(f.dtype)
    b_arr = np.array(b, dtype=np.float64).astype(f.dtype)
    if not (np.array_equal(a_arr.astype(np.float64), np.array(a)) and np.array_equal(b_arr.astype(np.float64), np.array(b))):
        raise AssertionError(f"internal: adversarial {kind} case is not representable in {f.name}")  # pragma: no cover
    return DotCase(a_arr, b_arr, _exact(a_arr, b_arr), kind, note)


def _small(f: Format) -> st.SearchStrategy[float]:
    """Values in [-1, 1] with few significand bits, representable in `f` (>= 2**-4 in magnitude)."""
    bits = min(f.precision - 1, 3)
    return st.tuples(st.integers(-(2**bits), 2**bits), st.integers(0, 4)).map(
        lambda t: math.ldexp(t[0], -bits - t[1])
    ).filter(lambda v: v != 0.0)


@st.composite
def _cancellation(draw, f: Format, max_k: int) -> DotCase:
    smalls = draw(st.lists(_small(f), min_size=1, max_size=max(1, max_k - 2)))
    # M large enough that the small terms are below half its ulp: ulp(M) = 2**(e - p + 1) > 2 * 1.
    e = draw(st.integers(f.precision + 1, max(f.precision + 1, min(f.emax - 1, f.precision + 4))))
    big = math.ldexp(1.0, e)
    i = draw(st.integers(0, len(smalls)))
    terms = smalls[:i] + [big] + smalls[i:]
    j = draw(st.integers(i + 1, len(terms)))
    terms = terms[:j] + [-big] + terms[j:]
    return _case(f, terms, [1.0] * len(terms), "cancellation",
                 f"+2**{e} at {i} and -2**{e} at {j} around {len(smalls)} terms in [-1, 1]")


@st.composite
def _swamping(draw, f: Format, max_k: int) -> DotCase:
    e = draw(st.integers(f.precision, max(f.precision, min(f.emax - 1, f.precision + 3))))
    big = math.ldexp(1.0, e)
    small = math.ldexp(1.0, e - f.precision - draw(st.integers(0, 2)))  # <= ulp(big) / 2
    count = draw(st.integers(1, max(1, max_k - 1)))
    return _case(f, [big] + [small] * count, [1.0] * (count + 1), "swamping",
                 f"2**{e} then {count} x {small!r} (each at most half an ulp of the running sum)")


@st.composite
def _overflow(draw, f: Format, max_k: int) -> DotCase:
    if draw(st.booleans()):
        # Products past max: x*y and -x*y with x*y > max (the 65519 test is one of these).
        x = draw(representable_floats(f, min_value=math.sqrt(f.max) * 1.0001, max_value=f.max))
        y = draw(representable_floats(f, min_value=f.max / x * 1.0001, max_value=f.max))
        if x * y <= f.max:  # pragma: no cover - guarded by the ranges above
            y = f.max
        return _case(f, [x, x], [y, -y], "overflow", f"products +-{x!r}*{y!r} exceed max {f.max!r}; exact sum 0")
    # Partial sums past max: t, t, -t, -t with 2t > max, each product exact.
    t = draw(representable_floats(f, min_value=f.max / 2 * 1.0001, max_value=f.max))
    return _case(f, [t, t, -t, -t], [1.0] * 4, "overflow", f"partial sum 2*{t!r} exceeds max {f.max!r}; exact sum 0")


@st.composite
def _subnormal(draw, f: Format, max_k: int) -> DotCase:
    count = draw(st.integers(1, max(1, min(max_k, 8))))
    a, b = [], []
    low = f.emin - f.precision - 1  # products down to a quarter of the smallest subnormal
    for _ in range(count):
        t = draw(st.integers(low, f.emin + 1))
        ea = t // 2
        m = draw(st.integers(2 ** (f.precision - 1), 2**f.precision - 1))
        a.append(math.ldexp(1.0, ea) * draw(st.sampled_from([1.0, -1.0])))
        b.append(math.ldexp(m, t - ea - f.precision + 1))
    return _case(f, a, b, "subnormal",
                 f"{count} products between 2**{low} and 2**{f.emin + 2} (smallest subnormal 2**{f.emin - f.precision + 1})")


def adversarial_dots(fmt: str | Format = "fp16", *, kind: str | None = None, max_k: int = 64) -> st.SearchStrategy[DotCase]:
    """Dot products that expose narrow accumulators (see the module docstring); `kind=None` mixes all four."""
    f = _format(fmt)
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 4:
        raise InvalidArgument(f"max_k must be an integer >= 4; received {max_k!r}")
    makers = {"cancellation": _cancellation, "swamping": _swamping, "overflow": _overflow, "subnormal": _subnormal}
    if kind is None:
        return st.one_of(*(m(f, max_k) for m in makers.values()))
    if kind not in makers:
        raise invalid_choice("kind", kind, ADVERSARIAL_KINDS)
    return makers[kind](f, max_k)
