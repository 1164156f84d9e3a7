"""Numerical assertions that read as sentences and explain the numbers when they fail.

    assert_accumulates_in("tensorflow/cpu/default", "fp32")
    assert_ulp_close(y, expected, 1, "fp16")
    assert_within_error_bound(y, reference, K=144, accumulate="fp16", kind="deterministic")
    assert_no_gradient_underflow(records, layer="stage1*", tolerance=0.0)
    assert_all_finite(y)

Each raises `AssertionError` whose message names the claim, the measured
numbers and the worst elements, and hides its own frames from pytest
tracebacks (`__tracebackhide__`). Bad arguments (an unknown format, a negative
ULP count) raise `InvalidArgument` instead: a wrong question is not a failed
claim. TensorFlow and pandas are imported only when an assertion needs them.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
import os
import reprlib
from enum import StrEnum
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from convprobe.analysis.bounds import BOUND_KINDS
from convprobe.errors import InvalidArgument, invalid_choice, is_integer
from convprobe.formats import Format, format_of_dtype, parse_format

__all__ = [
    "assert_accumulates_in",
    "assert_ulp_close",
    "assert_within_error_bound",
    "assert_no_gradient_underflow",
    "assert_all_finite",
    "ACCUMULATIONS",
    "BOUND_KINDS",
]

#: What `assert_accumulates_in` can check: the two accumulations the probes tell apart.
ACCUMULATIONS = ("fp16", "fp32")


#: How many offending elements a failure message lists.
_SHOWN = 5


# --------------------------------------------------------------------------- helpers


def _fmt(fmt: str | Format | None, actual: np.ndarray, argument: str = "format") -> Format:
    if fmt is None:
        try:
            return format_of_dtype(actual.dtype)
        except InvalidArgument:
            raise InvalidArgument(
                f"{argument} must be given when actual has dtype {actual.dtype}; "
                "name one of fp8_e4m3, fp8_e5m2, bf16, fp16, fp32, fp64"
            ) from None
    return parse_format(fmt, argument=argument)


def _received(value: object) -> str:
    """A wrong argument as a message names it: its type and a short repr (safe for any depth)."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _numbers(value: object, argument: str) -> np.ndarray:
    """`value` as an array of real numbers (bool, integer or float dtype): one InvalidArgument line
    naming `argument` otherwise, never numpy's "could not convert string to float" from deep inside."""
    what = f"{argument} must be an array of real numbers"
    if value is None or isinstance(value, (str, bytes, Mapping)):
        raise InvalidArgument(f"{what}; received {_received(value)}")
    try:
        a = np.asarray(value)
    except (TypeError, ValueError):  # ragged nested lists
        raise InvalidArgument(f"{what}; received a ragged {type(value).__name__} (its rows differ in length "
                              "or nesting)") from None
    if a.dtype.kind not in "biuf" and not _is_float_format(a.dtype):
        hint = " (None, text, or integers beyond int64 among the numbers)" if a.dtype.kind == "O" else ""
        raise InvalidArgument(f"{what}; received dtype {a.dtype}{hint}")
    return a


def _is_float_format(dtype: np.dtype) -> bool:
    """Whether `dtype` is one of the formats convprobe knows (ml_dtypes' bfloat16 and fp8 are kind 'V')."""
    try:
        format_of_dtype(dtype)
    except InvalidArgument:
        return False
    return True


def _positive(value: object, argument: str, what: str = "a positive number") -> None:
    """One InvalidArgument line unless `value` is a positive finite real (never a bool or a string)."""
    # typeshed's numbers.Real declares only __lt__/__le__ (no __gt__ for `0 < value`); every Real compares with 0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:  # type: ignore[operator]
        raise InvalidArgument(f"{argument} must be {what}; received {_received(value)}")


def _value(v: float) -> str:
    """A float as a person reads it, exact for every format up to fp32 (repr of float64)."""
    return repr(float(v))


def _index(flat: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return "()"
    return str(tuple(int(i) for i in np.unravel_index(flat, shape)))


def _pow2(x: float) -> str:
    """'2**-10' when x is a power of two, else the value."""
    if x > 0:
        m, e = math.frexp(x)
        if m == 0.5:
            return f"2**{e - 1}"
    return f"{x:.6g}"


# --------------------------------------------------------------------------- finite


def assert_all_finite(array: object, *, name: str = "array") -> None:
    """Assert that every element of `array` is finite (no inf, no NaN).

    The message counts infinities and NaNs and lists the first few positions.
    """
    __tracebackhide__ = True
    if not isinstance(name, str):
        raise InvalidArgument(f"name must be a string; received {_received(name)}")
    a = _numbers(array, name)
    with np.errstate(invalid="ignore"):
        wide = a.astype(np.float64)
    bad = ~np.isfinite(wide)
    if not bad.any():
        return
    n_nan = int(np.isnan(wide).sum())
    n_pinf = int(np.isposinf(wide).sum())
    n_ninf = int(np.isneginf(wide).sum())
    where = np.flatnonzero(bad.ravel())[:_SHOWN]
    lines = [
        f"{name} is not all finite: {int(bad.sum())} of {a.size} elements are not "
        f"({n_nan} NaN, {n_pinf} +inf, {n_ninf} -inf; dtype {a.dtype}).",
        "  first non-finite elements (index: value):",
    ]
    lines += [f"    {_index(i, a.shape)}: {_value(wide.ravel()[i])}" for i in where]
    raise AssertionError("\n".join(lines))


# --------------------------------------------------------------------------- ulps


def assert_ulp_close(actual: object, expected: object, max_ulp: int, format: str | Format | None = None) -> None:
    """Assert that `actual` is within `max_ulp` steps of `expected` in `format`.

    Distance counts the representable values of `format` between the two
    (`convprobe.analysis.ulp_distance`): 0 means bit-identical values (+0 and -0
    are 0 apart, two NaNs are 0 apart, inf is one step past the largest finite
    number). Both arrays must hold values representable in `format` (fp16,
    bf16, fp8_e4m3, fp8_e5m2, fp32, fp64; default: actual's dtype). To compare
    with an exact float64 reference use `assert_within_error_bound` or round
    the reference first.
    """
    __tracebackhide__ = True
    from convprobe.analysis import ulp, ulp_distance

    if not is_integer(max_ulp) or max_ulp < 0:
        raise InvalidArgument(f"max_ulp must be a non-negative integer; received {max_ulp!r}")
    a = _numbers(actual, "actual")
    e = _numbers(expected, "expected")
    fmt = _fmt(format, a)
    try:
        a_b, e_b = np.broadcast_arrays(a, e)
    except ValueError:
        raise InvalidArgument(f"actual and expected must have broadcastable shapes; received {a.shape} and {e.shape}") from None
    for arr, argument in ((a, "actual"), (e, "expected")):
        try:
            ulp_distance(arr, arr, fmt)
        except InvalidArgument as exc:
            detail = str(exc).split(" holds ", 1)[-1]
            raise InvalidArgument(f"{argument} holds {detail}; round it to {fmt.name} first") from None
    dist = np.asarray(ulp_distance(a_b, e_b, fmt)).reshape(a_b.shape)
    over = dist > max_ulp
    if not over.any():
        return
    a64 = a_b.astype(np.float64)
    e64 = e_b.astype(np.float64)
    order = np.argsort(-dist.ravel(), kind="stable")[: min(_SHOWN, int(over.sum()))]
    worst = int(dist.max())
    worst_text = "a NaN against a number" if worst == np.iinfo(np.int64).max else f"{worst} ulp"
    lines = [
        f"actual is not within {max_ulp} ulp of expected in {fmt.name}: "
        f"{int(over.sum())} of {dist.size} elements are farther, the worst {worst_text}.",
        f"  ({fmt.name}: p = {fmt.precision} bits, so one ulp at 1.0 is {_pow2(fmt.epsilon)}; "
        "distance = number of representable steps between the two values)",
        "  worst elements (index: actual vs expected, distance, ulp(expected)):",
    ]
    for i in order:
        d = int(dist.ravel()[i])
        d_text = "NaN vs number" if d == np.iinfo(np.int64).max else f"{d} ulp"
        step = float(ulp(e64.ravel()[i], fmt))
        lines.append(
            f"    {_index(i, dist.shape)}: {_value(a64.ravel()[i])} vs {_value(e64.ravel()[i])}, "
            f"{d_text}, ulp = {_pow2(step)}"
        )
    raise AssertionError("\n".join(lines))


# --------------------------------------------------------------------------- bounds


def assert_within_error_bound(
    actual: object,
    reference: object,
    K: int,
    accumulate: str | Format = "fp16",
    kind: str = "deterministic",
    *,
    abs_sum: object | None = None,
    output: str | Format | None = None,
    block_size: int | None = None,
    internal: str | Format | None = None,
    lam: float | None = None,
) -> None:
    """Assert |actual - reference| <= bound * S elementwise, for dot products of length K.

    S = sum_k |x_k w_k| per output (`abs_sum`; by default |reference|, which is
    exact for terms of one sign such as the classic U[0, 1) inputs and too
    small otherwise, so pass the fp64 conv of |x| and |w| for signed data).
    The bound is the analysis layer's `dot_error_bound(K, accumulate, kind)`,
    with u the unit roundoff of `accumulate`:

        deterministic   gamma_K(u) = K u / (1 - K u)             (Higham 2002, §3.1, (3.5))
        probabilistic   lambda sqrt(K) u, lambda = 3 by default  (Higham & Mary 2019)
        blocked         block-FMA bound, blocks of `block_size`  (Blanchard et al. 2020)

    If the result is stored in a narrower `output` format (default: actual's
    dtype when it is narrower than `accumulate`), its one rounding adds
    u_out + (1 + u_out) * bound. `reference` is the exact (fp64) result.
    """
    __tracebackhide__ = True
    from convprobe.analysis import DEFAULT_LAMBDA, dot_error_bound

    if kind not in BOUND_KINDS:
        raise invalid_choice("kind", kind, BOUND_KINDS)
    if not is_integer(K) or K < 1:
        raise InvalidArgument(f"K must be a positive integer (the reduction length); received {K!r}")
    acc = parse_format(accumulate, argument="accumulate")
    if lam is not None:
        _positive(lam, "lam")
    a = _numbers(actual, "actual")
    with np.errstate(all="ignore"):
        a64 = a.astype(np.float64)
        r64 = _numbers(reference, "reference").astype(np.float64)
    try:
        a64, r64 = np.broadcast_arrays(a64, r64)
    except ValueError:
        raise InvalidArgument(f"actual and reference must have broadcastable shapes; received {a.shape} and {r64.shape}") from None
    if abs_sum is None:
        s64 = np.abs(r64)
        decided = (np.isnan(a64) & np.isnan(r64)) | (np.isinf(a64) & (a64 == r64))  # equal: no bound needed
        unscaled = ~np.isfinite(r64) & ~decided
        if unscaled.any():
            i = int(np.flatnonzero(unscaled)[0])
            raise InvalidArgument(f"reference must be finite where it is the scale S = |reference| (no abs_sum "
                                  f"given); received {_value(r64.ravel()[i])} at {_index(i, r64.shape)}, where "
                                  f"actual is {_value(a64.ravel()[i])}: pass abs_sum (sum |x_k w_k| per output)")
    else:
        s_given = _numbers(abs_sum, "abs_sum").astype(np.float64)
        try:
            s64 = np.broadcast_to(s_given, r64.shape)
        except ValueError:
            raise InvalidArgument(f"abs_sum must broadcast to the shape of actual and reference {r64.shape}; "
                                  f"received shape {s_given.shape}") from None
        if not np.all(s64 >= 0):
            raise InvalidArgument("abs_sum must hold non-negative numbers, never NaN (the sum of |x_k w_k| per "
                                  f"output); received {_value(s64[~(s64 >= 0)].ravel()[0])}")
    out_fmt = None
    if output is not None:
        out_fmt = parse_format(output, argument="output")
    else:
        try:
            candidate = format_of_dtype(a.dtype)
            out_fmt = candidate if candidate.precision < acc.precision else None
        except InvalidArgument:
            out_fmt = None
    lam_value = DEFAULT_LAMBDA if lam is None else lam
    factor = float(dot_error_bound(  # refuses a keyword this kind does not read
        int(K), acc, kind, lam=lam, block_size=block_size, internal=internal,
        output=None if out_fmt is None else out_fmt,
    ))
    formula = {
        "deterministic": "gamma_K(u) = K u / (1 - K u)",
        "probabilistic": f"lambda sqrt(K) u with lambda = {lam_value:g}",
        "blocked": f"block-FMA bound with b = {block_size}" + (f", additions in {internal}" if internal else ""),
    }[kind]
    if out_fmt is not None:
        formula = f"u_{out_fmt.name} + (1 + u_{out_fmt.name}) * [{formula}]"
    allowed = factor * s64
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a64 - r64)
    both_nan = np.isnan(a64) & np.isnan(r64)
    same_inf = np.isinf(a64) & (a64 == r64)
    err = np.where(both_nan | same_inf, 0.0, np.where(np.isnan(err), np.inf, err))
    over = ~(err <= allowed)
    if not over.any():
        return
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, err / allowed, np.inf)
    order = np.argsort(-ratio.ravel(), kind="stable")[: min(_SHOWN, int(over.sum()))]
    worst = float(ratio.max())
    lines = [
        f"actual is not within the {kind} error bound of {acc.name} accumulation over K = {int(K)}: "
        f"{int(over.sum())} of {err.size} elements exceed it, the worst by {worst:.3g}x.",
        f"  bound = {formula} = {factor:.6g} per unit of S  (K = {int(K)}, u_{acc.name} = "
        f"{_pow2(acc.unit_roundoff)}; S = {'|reference|' if abs_sum is None else 'abs_sum = sum |x_k w_k|'})",
        "  worst elements (index: actual vs reference, |error| vs bound):",
    ]
    for i in order:
        lines.append(
            f"    {_index(i, err.shape)}: {_value(a64.ravel()[i])} vs {_value(r64.ravel()[i])}, "
            f"|error| {float(err.ravel()[i]):.6g} > bound {float(allowed.ravel()[i]):.6g}"
        )
    raise AssertionError("\n".join(lines))


# --------------------------------------------------------------------------- underflow

class UnderflowClass(StrEnum):
    """What `assert_no_gradient_underflow` counts: both kinds of underflow (the default, as
    the README defines underflow: zero in low precision, nonzero in fp32), or one of them."""

    UNDERFLOW = "underflow"  # flushed + lost
    FLUSHED = "flushed"      # the shadow |S*g| is at most half the smallest subnormal: rounded to zero
    LOST = "lost"            # the shadow value is representable: an upstream flush or cancellation

    @property
    def columns(self) -> tuple[str, ...]:
        return ("flushed", "lost") if self is UnderflowClass.UNDERFLOW else (str(self),)


_CLASS_TEXT = {
    UnderflowClass.UNDERFLOW: ("underflowed (flushed or lost)",
                               "underflow = zero in the low-precision run while the fp32 shadow |S*g| is nonzero: "
                               "flushed (the shadow is at most half the smallest subnormal, 2**-25 for fp16) or lost "
                               "(the shadow is representable: an upstream flush or cancellation)"),
    UnderflowClass.FLUSHED: ("were flushed to zero",
                             "flushed = zero in the low-precision run while the fp32 shadow |S*g| is nonzero and at "
                             "most half the smallest subnormal (2**-25 for fp16)"),
    UnderflowClass.LOST: ("were lost",
                          "lost = zero in the low-precision run while the fp32 shadow |S*g| is representable "
                          "(an upstream flush or cancellation)"),
}

#: Columns `assert_no_gradient_underflow` always needs from the harness's telemetry records
#: (plus the counted class's: flushed and lost by default).
_REQUIRED_COLUMNS = ("layer", "n")

#: What the columns it reads must hold (rules of `analysis.tables.VALUE_RULES`; optional ones when present).
_COLUMN_RULES = {"n": "count", "flushed": "count", "lost": "count", "subnormal": "count", "routing_zero": "count",
                 "step": "count", "loss_scale": "positive"}

_RECORD_FORMS = "a DataFrame, a list of dicts, a telemetry.csv path or a run directory"


def _telemetry_frame(records):
    """The harness's telemetry records as a DataFrame, from any of the forms it is kept in."""
    import pandas as pd

    from convprobe.analysis.tables import read_csv

    if isinstance(records, pd.DataFrame):
        return records
    if isinstance(records, (str, Path)):
        if not str(records).strip():  # Path('') would read the working directory's telemetry.csv
            raise InvalidArgument(f"records must be {_RECORD_FORMS}; received {records!r}")
        path = Path(records)
        if os.path.isdir(path):  # False, not an OSError, for a name too long: read_csv names it
            path = path / "telemetry.csv"
        return read_csv(path, where=f"records {str(path)!r}")
    for attribute in ("telemetry", "records"):
        inner = getattr(records, attribute, None)
        if inner is not None and not callable(inner):
            return _telemetry_frame(inner)
    if isinstance(records, Iterable) and not isinstance(records, (Mapping, bytes)):
        rows = list(records)
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise InvalidArgument(f"records must be {_RECORD_FORMS}; records[{i}] is {_received(row)}")
        return pd.DataFrame(rows)
    raise InvalidArgument(f"records must be {_RECORD_FORMS}; received {_received(records)}")


def _checked(frame, counted: UnderflowClass):
    """`frame` if it holds the telemetry the assertion reads, counts as counts; one line otherwise."""
    from convprobe.analysis.tables import check_values

    required = (*_REQUIRED_COLUMNS, *counted.columns)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InvalidArgument(
            f"records must have the telemetry columns {', '.join(required)}; missing {', '.join(missing)} "
            f"(columns present: {', '.join(map(str, frame.columns)) or 'none'})"
        )
    if frame.empty:
        raise InvalidArgument("records hold no telemetry rows: nothing was recorded, so nothing can be asserted")
    check_values(frame, _COLUMN_RULES, where="records")
    counted_sum = sum(frame[c].astype("float64") for c in counted.columns)
    over = counted_sum > frame["n"].astype("float64")
    if over.any():
        row = int(np.flatnonzero(over.to_numpy())[0])
        what = " + ".join(counted.columns)
        raise InvalidArgument(f"records: column{'s' if len(counted.columns) > 1 else ''} {what} must be at most n "
                              f"(values counted); row {row} holds {what} {int(counted_sum.iloc[row])} of n "
                              f"{frame['n'].iloc[row]}")
    return frame


def assert_no_gradient_underflow(
    records: object,
    *,
    layer: str | Sequence[str] | None = None,
    tolerance: float = 0.0,
    kind: str | None = None,
    counting: str = "underflow",
) -> None:
    """Assert that no more than `tolerance` of each layer's gradient values underflowed.

    `records` is per-layer telemetry (a DataFrame, a list of row dicts, a
    `telemetry.csv` or the run directory holding it: `convprobe train`'s or the
    `UnderflowTelemetry` callback's). A value *underflowed* when it is zero in
    the low-precision run while its fp32 shadow |S g| is nonzero, as the README
    defines underflow: `counting="underflow"` (the default) counts flushed + lost;
    `"flushed"` only values the format itself rounded to zero (shadow at most half
    the smallest subnormal, 2**-25 for fp16), `"lost"` only those whose shadow was
    representable (an upstream flush or cancellation). Routing zeros (ReLU,
    pooling) never count. The fraction is counted / n summed over every recorded
    step, per layer (and kind); the message lists the worst layers first.
    `layer` selects layers by name or glob ("stage1*"); `kind` is "weight" or
    "activation"; `tolerance` is a fraction in [0, 1] (0: no value may underflow).
    """
    __tracebackhide__ = True
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0.0 <= tolerance <= 1.0:
        raise InvalidArgument(f"tolerance must be a fraction in [0, 1]; received {tolerance!r}")
    if counting not in set(UnderflowClass):
        raise invalid_choice("counting", counting, list(UnderflowClass))
    counted = UnderflowClass(counting)
    frame = _checked(_telemetry_frame(records), counted)
    if layer is not None and not (isinstance(layer, str) or (
            isinstance(layer, Iterable) and all(isinstance(p, str) for p in layer))):
        raise InvalidArgument(f"layer must be a layer name or glob, or a list of them; received {_received(layer)}")
    if kind is not None and not isinstance(kind, str):
        raise InvalidArgument(f"kind must be 'weight' or 'activation'; received {_received(kind)}")
    layers = sorted(frame["layer"].astype(str).unique())
    if layer is not None:
        patterns = [layer] if isinstance(layer, str) else list(layer)
        chosen = [name for name in layers if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
        if not chosen:
            shown = ", ".join(layers[:20]) + (", ..." if len(layers) > 20 else "")
            raise InvalidArgument(f"layer must name recorded layers; received {layer!r}; recorded layers: {shown}")
        frame = frame[frame["layer"].astype(str).isin(chosen)]
    if kind is not None:
        if "kind" not in frame.columns:
            raise InvalidArgument("kind was given but records have no 'kind' column")
        kinds = sorted(frame["kind"].astype(str).unique())
        if kind not in kinds:
            raise invalid_choice("kind", kind, kinds)
        frame = frame[frame["kind"].astype(str) == kind]
    keys = ["layer"] + (["kind"] if "kind" in frame.columns else [])
    shown_columns = [c for c in ("flushed", "lost", "subnormal", "routing_zero") if c in frame.columns]
    grouped = frame.groupby(keys, sort=False)[["n", *shown_columns]].sum()
    grouped["counted"] = sum(grouped[c] for c in counted.columns)
    grouped["fraction"] = (grouped["counted"] / grouped["n"].where(grouped["n"] > 0)).fillna(0.0)
    bad = grouped[grouped["fraction"] > tolerance].sort_values("fraction", ascending=False, kind="stable")
    if bad.empty:
        return
    total_n = int(grouped["n"].sum())
    total = int(grouped["counted"].sum())
    scope = ("all layers" if layer is None else f"layer {layer!r}") + (f", {kind} gradients" if kind else "")
    steps = ""
    if "step" in frame.columns:
        steps = f" over steps {int(frame['step'].min())}..{int(frame['step'].max())}"
    scales = ""
    if "loss_scale" in frame.columns:
        values = sorted(set(float(s) for s in frame["loss_scale"]))
        scales = f", loss scale {', '.join(f'{s:g}' for s in values[:4])}{', ...' if len(values) > 4 else ''}"
    verb, definition = _CLASS_TEXT[counted]
    name = "+".join(counted.columns)
    worst = ", ".join(" ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
                      for key in bad.index[:3])
    lines = [
        f"gradients underflowed in {len(bad)} of {len(grouped)} (layer, kind) groups of {scope}"
        f"{steps}{scales}, worst {worst}: "
        + (f"some of their values {verb} " if tolerance == 0 else f"more than {tolerance:.3g} of their values {verb} ")
        + f"({total} of {total_n} values overall).",
        f"  {definition}; routing zeros (ReLU, pooling) are not counted.",
        f"  worst groups (layer [kind]: {name} / n = fraction; " + ", ".join(shown_columns) + "):",
    ]
    for key, row in bad.head(2 * _SHOWN).iterrows():
        label = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        more = ", ".join(f"{c} {int(row[c])}" for c in shown_columns)
        lines.append(f"    {label}: {int(row['counted'])} / {int(row['n'])} = {row['fraction']:.4g}; {more}")
    if len(bad) > 2 * _SHOWN:
        lines.append(f"    ... and {len(bad) - 2 * _SHOWN} more")
    lines.append("  a larger loss scale S moves gradients up, out of the flush range.")
    raise AssertionError("\n".join(lines))


# --------------------------------------------------------------------------- accumulation


def assert_accumulates_in(
    backend: object,
    accumulate: str,
    *,
    compare_params: dict | None = None,
    timeout: float = 300.0,
) -> list:
    """Assert that `backend` accumulates fp16 convolutions in `accumulate` (fp16 or fp32).

    Runs the two probes behind `convprobe overflow` and `convprobe compare`
    through the real runner (a TensorFlow configuration in its own child
    process, with its environment set before TensorFlow is imported):

    - overflow: the 65519 test; 0 means wide accumulation, inf or NaN fp16;
    - compare: real versus fake fp16 on the classic shapes (or
      `compare_params`); bit-identical or within the fp32-accumulation bound
      means fp32, beyond it but within the fp16 bound means fp16.

    Both must observe `accumulate`. `backend` is anything `resolve_target`
    accepts: a `BackendConfig`, the `conv_backend` fixture, a label such as
    "tensorflow/cpu/default", an emulator model ("sequential:fp16") or a
    backend object. Returns the two `ProbeResult`s.
    """
    __tracebackhide__ = True
    from concurrent.futures import ThreadPoolExecutor

    from convprobe.probes.runner import run_one
    from convprobe.testing.backends import resolve_target

    from convprobe.probes.compare import DEFAULT_SHAPES

    if accumulate not in ACCUMULATIONS:
        raise invalid_choice("accumulate", accumulate, ACCUMULATIONS)
    _positive(timeout, "timeout", "a positive number of seconds")
    if compare_params is not None:
        if not isinstance(compare_params, Mapping):
            raise InvalidArgument(f"compare_params must be a dict of the compare probe's parameters; received "
                                  f"{_received(compare_params)}")
        known = ("seed", *DEFAULT_SHAPES)
        for key, value in compare_params.items():
            if key not in known:
                raise invalid_choice("compare_params key", key, known)
            if not is_integer(value) or value < (0 if key == "seed" else 1):
                raise InvalidArgument(f"compare_params[{key!r}] must be an integer >= {0 if key == 'seed' else 1}; "
                                      f"received {_received(value)}")
    config = resolve_target(backend)
    jobs = [("overflow", {}), ("compare", {"seed": 0, **(compare_params or {})})]
    if config.isolated:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(lambda job: run_one(job[0], config, job[1], timeout=timeout), jobs))
    else:
        results = [run_one(name, config, params, timeout=timeout) for name, params in jobs]
    failed = [r for r in results if r.status != "ok"]
    wrong = [r for r in results if r.status == "ok" and r.accumulation != accumulate]
    if not failed and not wrong:
        return results
    # an ok result's accumulation is always set (runner.annotate, from the probe's interpret)
    observed = sorted({r.accumulation for r in results if r.status == "ok" and r.accumulation is not None})
    if failed:
        head = f"{config.label} could not be probed, so it is not shown to accumulate in {accumulate}:"
    elif len(observed) == 1:
        head = f"{config.label} does not accumulate in {accumulate}: it accumulates in {observed[0]}."
    else:
        head = (f"{config.label} does not accumulate in {accumulate}: the probes disagree "
                f"({', '.join(f'{r.probe} says {r.accumulation}' for r in results)}).")
    lines = [head]
    for r in results:
        title = {"overflow": "overflow probe (65519 test)", "compare": "compare probe (real vs fake fp16)"}.get(r.probe, r.probe)
        if r.status != "ok":
            lines.append(f"  {title}: {r.status}: {r.error}")
            continue
        lines.append(f"  {title}: {r.accumulation} - {r.verdict}")
        if r.evidence:
            lines.append(f"      {r.evidence}")
    env = config.environment or "(nothing set)"
    lines.append(f"  configuration: {config.label}; environment {env}" + (f"; {config.note}" if config.note else ""))
    raise AssertionError("\n".join(lines))
