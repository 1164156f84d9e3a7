"""Error metrics between an output and a reference, in the terms of a number format.

Everything here is NumPy only and exact where it can be: ULP distances are
counted on the integer encodings (IEEE 754 orders same-sign encodings like the
values they represent), ULP errors are one correctly rounded float64 division
by a power of two, and rounding to a format is done here in float64 arithmetic
because `ml_dtypes` casts float64 -> bf16/fp8 through float32 and so rounds
twice (1 + 2**-8 + 2**-40 becomes 1.0 in bf16 instead of 1 + 2**-7).

Non-finite conventions, shared by every function below so that no metric is
ever NaN: two NaNs agree (difference 0); a NaN against anything else is an
infinite difference; equal infinities agree; an infinity against anything else
is an infinite difference. Counting NaNs and infinities is `special_counts`'s
job, so the other metrics never hide them silently.
"""

from __future__ import annotations

import math

import numpy as np

from convprobe.errors import InvalidArgument
from convprobe.formats import Format, parse_format

__all__ = [
    "ULP_DISTANCE_MAX",
    "ulp",
    "round_nearest_even",
    "ulp_distance",
    "ulp_error",
    "relative_error",
    "max_relative_error",
    "median_relative_error",
    "relative_norm_error",
    "abs_sum_error",
    "max_abs_sum_error",
    "fraction_correctly_rounded",
    "max_abs_diff",
    "fraction_different",
    "special_counts",
    "summarize",
]

#: Returned by `ulp_distance` where no distance exists (exactly one side NaN) or
#: it does not fit in int64 (fp64 values of opposite sign, 2**63 apart or more).
#: The largest int64, so `max()` and `d <= n` treat such pairs as far apart.
ULP_DISTANCE_MAX = int(np.iinfo(np.int64).max)

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# --------------------------------------------------------------------------- inputs


def _format(fmt: str | Format, argument: str = "fmt") -> Format:
    if isinstance(fmt, Format):
        return fmt
    return parse_format(fmt, argument=argument)


def _as_float64(x: object, argument: str) -> np.ndarray:
    """`x` as a float64 array (exact for every format up to fp64)."""
    arr = np.asarray(x)
    if arr.dtype.kind in "cOSUMmb" or (arr.dtype.kind == "V" and arr.dtype.names is not None):
        raise InvalidArgument(
            f"{argument} must hold real floating-point numbers; received dtype {arr.dtype}"
        )
    try:
        with np.errstate(all="ignore"):
            return arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"{argument} must hold real floating-point numbers; received dtype {arr.dtype}"
        ) from exc


def _broadcast(argument_pair: str, *arrays: np.ndarray) -> list[np.ndarray]:
    try:
        return list(np.broadcast_arrays(*arrays))
    except ValueError as exc:
        shapes = " and ".join(str(a.shape) for a in arrays)
        raise InvalidArgument(f"{argument_pair} must have broadcastable shapes; received {shapes}") from exc


def _to_storage(x: object, fmt: Format, argument: str) -> np.ndarray:
    """`x` in `fmt`'s storage dtype; raises if a value is not representable in `fmt`."""
    dt = fmt.dtype
    arr = np.asarray(x)
    if arr.dtype == dt:
        return arr
    wide = _as_float64(arr, argument)
    with np.errstate(all="ignore"):
        stored = wide.astype(dt)
        back = stored.astype(np.float64)
    same = (back == wide) | (np.isnan(back) & np.isnan(wide))
    if not np.all(same):
        bad = wide[~same]
        raise InvalidArgument(
            f"{argument} holds {bad.size} value(s) not representable in {fmt.name}, "
            f"e.g. {float(bad.flat[0])!r}"
        )
    return stored


def _require_nonempty(arr: np.ndarray, argument: str) -> None:
    if arr.size == 0:
        raise InvalidArgument(f"{argument} must be non-empty; received an array of shape {arr.shape}")


# --------------------------------------------------------------------------- ulps


def ulp(x: object, fmt: str | Format) -> np.ndarray:
    """ulp(x) in `fmt`, Goldberg's definition, as float64.

    For |x| in [2**e, 2**(e+1)), ulp(x) = 2**(max(e, emin) - p + 1): the gap
    *above* a power of two, the subnormal spacing 2**(emin-p+1) for |x| < 2**emin
    (and at 0), and the same formula past the largest finite number. With this
    definition round-to-nearest satisfies |RN(x) - x| <= ulp(x)/2 for every x in
    range. References: D. Goldberg, "What every computer scientist should know
    about floating-point arithmetic", ACM Comput. Surv. 23(1), 1991, §1.2;
    J.-M. Muller et al., Handbook of Floating-Point Arithmetic, Birkhäuser 2010,
    §2.6.1 "The ulp function" (Goldberg's definition, next to Harrison's, which
    differs at powers of two). ulp(±inf) = inf, ulp(NaN) = NaN.
    """
    f = _format(fmt)
    v = _as_float64(x, "x")
    with np.errstate(all="ignore"):
        _, e = np.frexp(np.abs(v))  # |v| = m * 2**e with m in [0.5, 1): floor(log2|v|) = e - 1
        exponent = np.maximum(e.astype(np.int64) - 1, f.emin)
        exponent = np.where(v == 0, f.emin, exponent)  # frexp(0) has exponent 0
        out = np.ldexp(1.0, (exponent - f.precision + 1).astype(np.int32))
    out = np.where(np.isinf(v), np.inf, out)
    return np.where(np.isnan(v), np.nan, out)


def round_nearest_even(x: object, fmt: str | Format) -> np.ndarray:
    """float64 values rounded once to nearest, ties to even, in `fmt`; as float64.

    Scaling by ulp(x) (a power of two) is exact, so `np.rint` on x/ulp(x) is one
    correct rounding (IEEE 754-2019 §4.3.1, roundTiesToEven). Overflow follows
    the unbounded-exponent rule: a result above `fmt.max` becomes ±inf, or NaN
    for formats without infinities (fp8_e4m3, as the OCP FP8 spec and ml_dtypes
    do). Subnormals are kept. Written here, not via `astype`, because ml_dtypes
    rounds float64 -> bf16/fp8 twice (through float32).
    """
    f = _format(fmt)
    v = _as_float64(x, "x")
    if f.precision >= 53 and f.emin <= -1022:
        return v.copy()
    with np.errstate(all="ignore"):
        step = ulp(v, f)
        r = np.rint(v / step) * step
        over = np.isfinite(v) & (np.abs(r) > f.max)
        r = np.where(over, np.copysign(np.inf, v) if f.has_inf else np.nan, r)
        r = np.where(np.isfinite(v), r, v)
        # Keep the sign of zero results (rint(-0.3) is -0.0 already; be explicit).
        r = np.where(r == 0, np.copysign(0.0, v), r)
    if not f.has_inf:
        r = np.where(np.isinf(v), np.nan, r)
    return r


def _sign_magnitude(stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sign bit and magnitude bits of the encodings, as bool and uint64 arrays."""
    size = stored.dtype.itemsize
    bits = np.ascontiguousarray(stored).view(_UINT_OF_SIZE[size]).astype(np.uint64)
    sign_bit = np.uint64(1) << np.uint64(8 * size - 1)
    return (bits & sign_bit) != 0, bits & (sign_bit - np.uint64(1))


def ulp_distance(a: object, b: object, fmt: str | Format) -> np.ndarray:
    """How many steps through the values of `fmt` separate a and b, as int64.

    a and b must hold values representable in `fmt` (arrays of its storage dtype,
    or any float array holding such values; otherwise InvalidArgument). On the
    sign-magnitude encodings, the distance is |mag_a - mag_b| for equal signs and
    mag_a + mag_b for opposite signs, so +0 and -0 are 0 apart and the smallest
    subnormals of opposite sign are 2 apart. Infinity is one step past ±max (its
    encoding follows max's). Two NaNs are 0 apart; a NaN and a non-NaN are
    `ULP_DISTANCE_MAX` apart, which also caps fp64 distances of 2**63 or more.
    """
    f = _format(fmt)
    return _distance(*_broadcast("a and b", _to_storage(a, f, "a"), _to_storage(b, f, "b")))


def _distance(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """`ulp_distance` on broadcast arrays of one storage dtype."""
    neg_a, mag_a = _sign_magnitude(sa)
    neg_b, mag_b = _sign_magnitude(sb)
    same_side = np.maximum(mag_a, mag_b) - np.minimum(mag_a, mag_b)
    opposite = mag_a + mag_b  # each < 2**63, so the sum fits in uint64
    d = np.where(neg_a == neg_b, same_side, opposite)
    d = np.where(d > np.uint64(ULP_DISTANCE_MAX), np.uint64(ULP_DISTANCE_MAX), d).astype(np.int64)
    with np.errstate(invalid="ignore"):  # signalling-NaN encodings warn when widened
        nan_a = np.isnan(sa.astype(np.float64))
        nan_b = np.isnan(sb.astype(np.float64))
    d = np.where(nan_a & nan_b, 0, d)
    return np.where(nan_a ^ nan_b, ULP_DISTANCE_MAX, d).astype(np.int64)


def _abs_diff(a: np.ndarray, r: np.ndarray) -> np.ndarray:
    """|a - r| with the module's non-finite conventions (never NaN)."""
    with np.errstate(all="ignore"):
        d = np.abs(a - r)
    nan_a, nan_r = np.isnan(a), np.isnan(r)
    agree = (nan_a & nan_r) | (np.isinf(a) & (a == r))
    d = np.where(agree, 0.0, d)
    return np.where(nan_a ^ nan_r, np.inf, d)


def _ratio(diff: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """diff/scale with 0/anything = 0 and every undefined nonzero case = inf."""
    with np.errstate(all="ignore"):
        q = diff / scale
    q = np.where(np.isnan(q), np.inf, q)
    return np.where(diff == 0, 0.0, q)


def ulp_error(actual: object, reference: object, fmt: str | Format) -> np.ndarray:
    """|actual - reference| / ulp(reference) in `fmt`, as float64.

    reference is the exact (or fp64) value; it need not be representable in
    `fmt`. ulp is Goldberg's (see `ulp`), so a correctly rounded result has
    ulp_error <= 0.5, exactly 0.5 at a tie. The float64 subtraction is one
    correct rounding and the division by a power of two is exact (barring
    float64 underflow), so the value is the exact ULP error correctly rounded.
    Non-finite values follow the module conventions: 0 where both agree, inf
    otherwise.
    """
    f = _format(fmt)
    a, r = _broadcast(
        "actual and reference", _as_float64(actual, "actual"), _as_float64(reference, "reference")
    )
    return _ratio(_abs_diff(a, r), ulp(r, f))


# --------------------------------------------------------------------------- relative errors


def relative_error(actual: object, reference: object) -> np.ndarray:
    """|actual - reference| / |reference| elementwise, as float64.

    0 where they agree (including 0 vs 0, NaN vs NaN, equal infinities); inf
    where reference is 0 and actual is not, or where only one side is non-finite.
    """
    a, r = _broadcast(
        "actual and reference", _as_float64(actual, "actual"), _as_float64(reference, "reference")
    )
    return _ratio(_abs_diff(a, r), np.abs(r))


def max_relative_error(actual: object, reference: object) -> float:
    """The largest elementwise `relative_error` (inf if any element is infinitely wrong)."""
    e = relative_error(actual, reference)
    _require_nonempty(e, "actual")
    return float(np.max(e))


def median_relative_error(actual: object, reference: object) -> float:
    """The median elementwise `relative_error`: the typical element, robust to a few outliers."""
    e = relative_error(actual, reference)
    _require_nonempty(e, "actual")
    return float(np.median(e))


def _norm2(v: np.ndarray) -> float:
    """Euclidean norm, scaled so that squaring cannot overflow or underflow."""
    if v.size == 0:
        return 0.0
    s = float(np.max(np.abs(v)))
    if s == 0.0 or not math.isfinite(s):
        return s
    return s * float(np.sqrt(np.sum(np.square(v / s))))


def relative_norm_error(actual: object, reference: object) -> float:
    """||actual - reference||_2 / ||reference||_2 over all elements.

    The normwise relative error (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., SIAM 2002, ch. 1): one number for a whole output
    tensor, dominated by its largest entries. Differences follow the module conventions; the
    denominator uses the finite reference entries. 0/0 = 0; x/0 = inf for x > 0.
    """
    a, r = _broadcast(
        "actual and reference", _as_float64(actual, "actual"), _as_float64(reference, "reference")
    )
    _require_nonempty(a, "actual")
    num = _norm2(_abs_diff(a, r).ravel())
    den = _norm2(r[np.isfinite(r)].ravel())
    if num == 0.0:
        return 0.0
    if den == 0.0 or math.isinf(num):
        return math.inf
    return num / den


def abs_sum_error(actual: object, reference: object, abs_sum: object) -> np.ndarray:
    """|actual - reference| / abs_sum elementwise, abs_sum = sum_i |x_i y_i| per output.

    The quantity the dot-product bounds in `convprobe.analysis.bounds` bound
    (Higham 2002, (3.5)); unlike the relative error it stays meaningful when
    the terms cancel (U[-1, 1) inputs). abs_sum is the exact fp64 conv of |x|
    and |w|. 0/0 = 0; nonzero/0 = inf.
    """
    a, r, s = _broadcast(
        "actual, reference and abs_sum",
        _as_float64(actual, "actual"),
        _as_float64(reference, "reference"),
        _as_float64(abs_sum, "abs_sum"),
    )
    if np.any(s < 0):
        raise InvalidArgument("abs_sum must be non-negative (a sum of absolute values)")
    return _ratio(_abs_diff(a, r), s)


def max_abs_sum_error(actual: object, reference: object, abs_sum: object) -> float:
    """The largest `abs_sum_error`: compare it with `dot_error_bound`."""
    e = abs_sum_error(actual, reference, abs_sum)
    _require_nonempty(e, "actual")
    return float(np.max(e))


def fraction_correctly_rounded(actual: object, reference_fp64: object, fmt: str | Format) -> float:
    """Fraction of elements equal to their reference rounded to nearest-even in `fmt`.

    Compared as values (+0 == -0; NaN == NaN, which is what overflow gives in
    formats without infinities). Rounding uses `round_nearest_even`.
    """
    f = _format(fmt)
    a, r = _broadcast(
        "actual and reference_fp64",
        _as_float64(actual, "actual"),
        _as_float64(reference_fp64, "reference_fp64"),
    )
    _require_nonempty(a, "actual")
    rn = round_nearest_even(r, f)
    ok = (a == rn) | (np.isnan(a) & np.isnan(rn))
    return float(np.count_nonzero(ok)) / ok.size


# --------------------------------------------------------------------------- comparisons


def max_abs_diff(a: object, b: object) -> float:
    """max |a - b| (module conventions for non-finite values); 0.0 for empty inputs."""
    x, y = _broadcast("a and b", _as_float64(a, "a"), _as_float64(b, "b"))
    if x.size == 0:
        return 0.0
    return float(np.max(_abs_diff(x, y)))


def fraction_different(a: object, b: object) -> float:
    """Fraction of elements whose values differ bitwise (+0 vs -0 differ; any NaN matches any NaN).

    Compared on the float64 encodings, which are exact for every format, so an
    fp16 output and an fp32 output holding the same value count as equal.
    """
    x, y = _broadcast("a and b", _as_float64(a, "a"), _as_float64(b, "b"))
    _require_nonempty(x, "a")
    same = np.ascontiguousarray(x).view(np.uint64) == np.ascontiguousarray(y).view(np.uint64)
    same |= np.isnan(x) & np.isnan(y)
    return 1.0 - float(np.count_nonzero(same)) / same.size


def special_counts(actual: object, reference: object | None = None) -> dict[str, int | None]:
    """Counts of inf, nan and zero in `actual`; with a reference also underflow and overflow.

    underflow: actual is ±0 where the reference is nonzero (a value flushed or
    rounded to zero). overflow: actual is ±inf where the reference is finite.
    Both are None without a reference.
    """
    a = _as_float64(actual, "actual")
    counts: dict[str, int | None] = {
        "size": int(a.size),
        "inf": int(np.count_nonzero(np.isinf(a))),
        "nan": int(np.count_nonzero(np.isnan(a))),
        "zero": int(np.count_nonzero(a == 0)),
        "underflow": None,
        "overflow": None,
    }
    if reference is not None:
        x, r = _broadcast("actual and reference", a, _as_float64(reference, "reference"))
        counts["underflow"] = int(np.count_nonzero((x == 0) & (r != 0) & ~np.isnan(r)))
        counts["overflow"] = int(np.count_nonzero(np.isinf(x) & np.isfinite(r)))
    return counts


def summarize(
    actual: object, reference: object, fmt: str | Format, *, abs_sum: object | None = None
) -> dict[str, object]:
    """Every scalar metric of `actual` against the exact `reference`, as plain Python values.

    `actual` must be representable in `fmt` (it is the format's output). ULP
    distance and bitwise difference are measured against the reference rounded
    to `fmt` (0 ulps = correctly rounded); ULP error against the reference
    itself. With `abs_sum` (sum|x_i w_i| per output) max_abs_sum_error is
    filled, else it is None. The keys are the sweep table's metric columns.
    Infinite metrics are float('inf') (json.dumps writes Infinity).
    """
    f = _format(fmt)
    a, r = _broadcast(
        "actual and reference", _as_float64(actual, "actual"), _as_float64(reference, "reference")
    )
    _require_nonempty(a, "actual")
    rn = round_nearest_even(r, f)
    ue = ulp_error(a, r, f)
    dist = _distance(*_broadcast("actual and reference", _to_storage(a, f, "actual"),
                                 _to_storage(rn, f, "reference rounded to fmt")))
    special = special_counts(a, r)
    return {
        "format": f.name,
        "n": int(a.size),
        "max_abs_diff": max_abs_diff(a, r),
        "max_relative_error": max_relative_error(a, r),
        "median_relative_error": median_relative_error(a, r),
        "relative_norm_error": relative_norm_error(a, r),
        "max_ulp_error": float(np.max(ue)),
        "median_ulp_error": float(np.median(ue)),
        "max_ulp_distance": int(np.max(dist)),
        "fraction_correctly_rounded": fraction_correctly_rounded(a, r, f),
        "fraction_different": fraction_different(a, rn),
        "max_abs_sum_error": None if abs_sum is None else max_abs_sum_error(a, r, abs_sum),
        "inf_count": special["inf"],
        "nan_count": special["nan"],
        "zero_count": special["zero"],
        "underflow_count": special["underflow"],
        "overflow_count": special["overflow"],
    }
