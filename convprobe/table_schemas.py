"""The schemas of convprobe's tidy tables and their validation: a bottom-layer module, so
that the results envelope can check a table it carries without importing the analysis
layer (`convprobe.analysis.tables` builds, reads and writes the tables)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from convprobe.errors import InvalidArgument, invalid_choice, reason
from convprobe.options import Status

__all__ = ["TABLE_SCHEMA_VERSION", "STATUSES", "Column", "Schema", "SWEEP_SCHEMA", "PROBE_SCHEMA", "SCHEMAS",
           "validate_frame", "schema_of", "empty_frame"]


#: Version of the column lists below; bump it when a column is added, removed or renamed.
TABLE_SCHEMA_VERSION = 1

#: How a configuration's run ended (`convprobe.options.Status`).
STATUSES = tuple(s.value for s in Status)

Kind = Literal["str", "int", "float", "bool"]
_DTYPES: dict[str, str] = {"str": "str", "int": "Int64", "float": "float64", "bool": "boolean"}


@dataclass(frozen=True)
class Column:
    """One column: its name, value kind, whether every row must have it, its meaning, and the
    range its values must lie in (`low`..`high`, either end open when None; empty cells pass)."""

    name: str
    kind: Kind
    required: bool
    description: str
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Schema:
    """A named, versioned, ordered list of columns."""

    name: str
    version: int
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.required)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise invalid_choice("column", name, self.names)


def _c(name: str, kind: Kind, description: str, required: bool = False, low: float | None = None,
       high: float | None = None) -> Column:
    return Column(name, kind, required, description, low, high)


def _count(name: str, description: str, required: bool = False) -> Column:
    return _c(name, "int", description, required, low=0)


def _fraction(name: str, description: str) -> Column:
    return _c(name, "float", description, low=0, high=1)


def _error(name: str, description: str) -> Column:
    return _c(name, "float", description, low=0)


_IDENTITY = (
    _c("schema_version", "int", "TABLE_SCHEMA_VERSION of the writer", True),
    _c("backend", "str", "engine: tensorflow, emulated, ...", True),
    _c("configuration", "str", "configuration label or emulator model name", True),
    _c("device", "str", "cpu or gpu", True),
    _c("op", "str", "conv2d, conv2d_backprop_input, conv2d_backprop_filter, depthwise, conv3d, matmul, einsum", True),
)
_TRAILER = (
    _c("status", "str", "one of STATUSES", True),
    _c("detail", "str", "error message or note for a non-ok row"),
    _error("wall_s", "seconds the run took"),
    _c("environment", "str", "the precision environment variables, 'K=V K=V'"),
    _c("provenance", "str", "provenance record as JSON (DESIGN.md convention 7)"),
)

#: Error versus reduction length: one row per configuration x op x distribution x K x seed.
#: Metric columns are `metrics.summarize` keys; bound columns are filled by `add_bounds`.
SWEEP_SCHEMA = Schema(
    "sweep",
    TABLE_SCHEMA_VERSION,
    _IDENTITY
    + (
        _c("format", "str", "storage format of the output (the fmt of the metrics)", True),
        _c("distribution", "str", "input distribution, e.g. uniform01, uniform11, normal, heavy_tailed", True),
        _count("k", "reduction length C_in*kh*kw (or the contracted dimension); 0 in rows of failed runs", True),
        _count("seed", "seed of the inputs", True),
        _count("n", "number of outputs measured"),
        _error("max_abs_diff", "max |actual - reference|"),
        _error("max_relative_error", "max |actual - ref| / |ref|"),
        _error("median_relative_error", "median |actual - ref| / |ref|"),
        _error("relative_norm_error", "||actual - ref||_2 / ||ref||_2"),
        _error("max_ulp_error", "max |actual - ref| / ulp(ref) in format"),
        _error("median_ulp_error", "median ULP error"),
        _count("max_ulp_distance", "max ULP distance to the correctly rounded reference"),
        _fraction("fraction_correctly_rounded", "share equal to RN(ref)"),
        _fraction("fraction_different", "share bitwise different from RN(ref)"),
        _count("inf_count", "infinities in the output"),
        _count("nan_count", "NaNs in the output"),
        _count("zero_count", "zeros in the output"),
        _count("underflow_count", "zeros where the reference is nonzero"),
        _count("overflow_count", "infinities where the reference is finite"),
        _error("max_abs_sum_error", "max |actual - ref| / sum|x_i w_i|: what the bounds bound"),
        _c("bound_format", "str", "accumulator format the bound columns assume"),
        _c("lam", "float", "lambda of probabilistic_bound"),
        _c("gamma_bound", "float", "gamma_K(u) (+ output rounding); NaN where K*u >= 1"),
        _c("probabilistic_bound", "float", "lambda sqrt(K) u (+ output rounding)"),
        _c("exceeds_probabilistic", "bool", "max_abs_sum_error > probabilistic_bound"),
        _c("stagnated", "bool", "the running sum stopped growing (fp16 stagnation)"),
    )
    + _TRAILER,
)

#: Probe and fingerprint evidence, long form: one row per configuration x op x probe x property.
PROBE_SCHEMA = Schema(
    "probe",
    TABLE_SCHEMA_VERSION,
    _IDENTITY
    + (
        _c("probe", "str", "probe name: overflow, compare, fingerprint battery member, ...", True),
        _c("property", "str", "what was inferred: accumulation, accumulator_bits, rounding, block_size, ...", True),
        _c("value", "str", "the inferred value, as text ('fp32', '24', 'nearest', ...); empty if not run"),
        _c("evidence", "str", "the observation that decided it"),
        _count("seed", "seed of random inputs, if any"),
    )
    + _TRAILER,
)

SCHEMAS: dict[str, Schema] = {s.name: s for s in (SWEEP_SCHEMA, PROBE_SCHEMA)}


def schema_of(schema: Schema | str) -> Schema:
    if isinstance(schema, Schema):
        return schema
    if schema not in SCHEMAS:
        raise invalid_choice("schema", schema, SCHEMAS)
    return SCHEMAS[schema]


def _column_problems(columns: Iterable[str], schema: Schema, where: str) -> str | None:
    present = list(columns)
    missing = [c for c in schema.names if c not in present]
    extra = [c for c in present if c not in schema.names]
    if not missing and not extra:
        return None
    parts = []
    if missing:
        parts.append(f"missing column(s) {', '.join(missing)}")
    if extra:
        parts.append(f"unknown column(s) {', '.join(extra)}")
    return f"{where} does not match the {schema.name} schema v{schema.version}: {'; '.join(parts)}"


def _check_values(df: pd.DataFrame, schema: Schema, where: str) -> None:
    versions = set(pd.unique(df["schema_version"].dropna()))
    if versions - {schema.version}:
        found = ", ".join(str(v) for v in sorted(versions, key=str))
        raise InvalidArgument(
            f"{where} has schema_version {found}; this convprobe reads {schema.name} schema v{schema.version}"
        )
    for name in schema.required:
        if df[name].isna().any():
            row = int(np.flatnonzero(df[name].isna().to_numpy())[0])
            raise InvalidArgument(f"{where}: required column {name} is empty in row {row}")
    bad = sorted(set(df["status"]) - set(STATUSES))
    if bad:
        raise invalid_choice(f"{where}: status", bad[0], STATUSES)
    for col in schema.columns:
        if col.low is None and col.high is None:
            continue
        values = df[col.name].astype("float64")
        outside = (values < (-np.inf if col.low is None else col.low)) | (values > (np.inf if col.high is None else col.high))
        if outside.any():
            row = int(np.flatnonzero(outside.to_numpy(dtype=bool, na_value=False))[0])
            allowed = f"from {col.low:g} to {col.high:g}" if col.high is not None else f">= {col.low:g}"
            raise InvalidArgument(f"{where}: column {col.name} must hold values {allowed}; row {row} holds "
                                  f"{values.iloc[row]:g}")


def _coerce(df: pd.DataFrame, schema: Schema, where: str) -> pd.DataFrame:
    out = {}
    for col in schema.columns:
        series = df[col.name]
        try:
            if series.dtype == object and series.map(lambda v: isinstance(v, (list, dict))).any():
                raise ValueError("a list or an object is not one value")  # str() would make any of them text
            if col.kind in ("int", "float") and (series.dtype == bool or (
                    series.dtype == object and series.map(lambda v: isinstance(v, (bool, np.bool_))).any())):
                raise ValueError("true/false is not a number")
            if col.kind == "bool" and series.dtype == object:
                series = series.map(_parse_bool, na_action="ignore")
            if col.kind == "int":
                as_float = pd.to_numeric(series, errors="raise").astype("float64")
                if (((as_float % 1) != 0) & as_float.notna()).any():
                    raise ValueError("non-integral value")
                out[col.name] = as_float.astype("Int64")
            elif col.kind == "str":
                text = series.astype("str")
                out[col.name] = text.mask(text == "")  # CSV cannot tell "" from missing: neither can we
            else:
                out[col.name] = series.astype(_DTYPES[col.kind])
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:  # an integer beyond float; a cell nested too deeply
            raise InvalidArgument(f"{where}: column {col.name} must hold {col.kind} values ({reason(exc)})") from None
    return pd.DataFrame(out, index=df.index)


def _parse_bool(value: object) -> object:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def validate_frame(df: pd.DataFrame, schema: Schema | str, *, where: str = "table") -> pd.DataFrame:
    """Check `df` against `schema` and return it with the schema's column order and dtypes.

    Raises InvalidArgument naming missing or unknown columns, a foreign
    schema_version, empty required cells, bad status values or wrong kinds.
    """
    s = schema_of(schema)
    problem = _column_problems(df.columns, s, where)
    if problem:
        raise InvalidArgument(problem)
    frame = _coerce(df, s, where)
    _check_values(frame, s, where)
    return frame


def empty_frame(schema: Schema | str) -> pd.DataFrame:
    """A zero-row frame with the schema's columns and dtypes."""
    s = schema_of(schema)
    return pd.DataFrame({c.name: pd.Series([], dtype=_DTYPES[c.kind]) for c in s.columns})
