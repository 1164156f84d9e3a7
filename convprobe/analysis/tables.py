"""Tidy tables with a fixed column schema: error-vs-K sweeps and probe/fingerprint rows.

One row per observation, one column per variable (Wickham, "Tidy data", J. Stat.
Softw. 59(10), 2014), so that a sweep from any configuration, a crashed row and
an emulator model's row all share columns and concatenate, plot and pivot
without special cases. The column lists below are the file format: a results
file whose columns or `schema_version` differ is refused with InvalidArgument
naming what is missing, extra or mismatched (the CLI turns that into exit 2).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from convprobe import files

from convprobe.analysis.bounds import DEFAULT_LAMBDA, dot_error_bound
from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.formats import parse_format
from convprobe.results import read_json, reason, regular_file, show
from convprobe.table_schemas import (PROBE_SCHEMA, SCHEMAS, STATUSES, SWEEP_SCHEMA, TABLE_SCHEMA_VERSION, Column, Schema,
                                     empty_frame, schema_of, validate_frame)

__all__ = [
    "TABLE_SCHEMA_VERSION",
    "STATUSES",
    "Column",
    "Schema",
    "SWEEP_SCHEMA",
    "PROBE_SCHEMA",
    "SCHEMAS",
    "validate_frame",
    "frame_from_records",
    "empty_frame",
    "read_table",
    "read_csv",
    "VALUE_RULES",
    "check_values",
    "write_table",
    "add_bounds",
    "fingerprint_table",
    "FINGERPRINT_TITLES",
]

def frame_from_records(records: Iterable[Mapping[str, object]], schema: Schema | str) -> pd.DataFrame:
    """Build a validated frame from result dicts (e.g. identity keys | `summarize(...)`).

    Each record must have every required column except schema_version (filled
    in); optional columns it lacks are left empty (a crashed row has no
    metrics). A key outside the schema is an error, so typos cannot create
    columns silently.
    """
    s = schema_of(schema)
    rows = []
    for i, record in enumerate(records):
        keys = set(record)
        extra = sorted(keys - set(s.names))
        if extra:
            raise InvalidArgument(
                f"record {i} has unknown column(s) {', '.join(extra)} for the {s.name} schema v{s.version}"
            )
        missing = [c for c in s.required if c not in keys and c != "schema_version"]
        if missing:
            raise InvalidArgument(
                f"record {i} is missing required column(s) {', '.join(missing)} of the {s.name} schema"
            )
        row = {name: record.get(name) for name in s.names}
        if row["schema_version"] is None:
            row["schema_version"] = s.version
        rows.append(row)
    if not rows:
        return empty_frame(s)
    return validate_frame(pd.DataFrame(rows, columns=list(s.names)), s, where="records")


def _records(df: pd.DataFrame) -> list[dict[str, object]]:
    out = []
    for row in df.to_dict(orient="records"):
        clean: dict[str, object] = {}
        for key, value in row.items():
            if value is pd.NA or (isinstance(value, float) and math.isnan(value)):
                clean[key] = None
            elif isinstance(value, np.generic):
                clean[key] = value.item()
            else:
                clean[key] = value
        out.append(clean)
    return out


def write_table(df: pd.DataFrame, path: str | Path, schema: Schema | str) -> Path:
    """Validate `df` and write it as CSV (.csv) or a JSON list of records (.json)."""
    s = schema_of(schema)
    frame = validate_frame(df, s)
    p = Path(path)
    if p.suffix == ".csv":
        files.write_atomic(p, frame.to_csv(index=False))
    elif p.suffix == ".json":
        files.write_atomic(p, json.dumps({"schema": s.name, "rows": _records(frame)}, indent=1) + "\n")
    else:
        raise invalid_choice("path suffix", p.suffix, (".csv", ".json"))
    return p
    return p


def read_table(path: str | Path, schema: Schema | str) -> pd.DataFrame:
    """Read a table written by `write_table`, refusing other schemas or versions."""
    s = schema_of(schema)
    p = Path(path)
    where = f"results file {p.name}"
    if p.suffix == ".csv":
        return validate_frame(read_csv(p, where=where), s, where=where)
    if p.suffix == ".json":
        payload = read_json(p, where=where)
        if not isinstance(payload, dict) or "rows" not in payload:
            raise InvalidArgument(f"{where} is not a convprobe table (expected an object with 'rows')")
        if payload.get("schema") != s.name:
            raise InvalidArgument(f"{where} holds a {show(payload.get('schema'))} table, not {s.name!r}")
        rows = payload["rows"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InvalidArgument(f"{where}: 'rows' must be a list of objects")
        columns = list(dict.fromkeys(key for r in rows for key in r)) if rows else list(s.names)
        df = pd.DataFrame(rows, columns=columns)
        return validate_frame(df, s, where=where)
    raise invalid_choice("path suffix", p.suffix, (".csv", ".json"))


def read_csv(path: str | Path, *, where: str) -> pd.DataFrame:
    """The CSV table at `path` (a UTF-8 byte order mark is allowed): one InvalidArgument line for
    a missing or unreadable file, an empty one, bytes that are not CSV text, or a row with more
    fields than the header (which pandas would silently turn into an index)."""
    p = regular_file(path, where=where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(p, index_col=False)
    except pd.errors.EmptyDataError:
        raise InvalidArgument(f"{where} is empty (not even a header line)") from None
    except pd.errors.ParserWarning:
        raise InvalidArgument(f"{where} has a row with more fields than its header line") from None
    except OSError as exc:
        raise InvalidArgument(f"{where} cannot be read ({reason(exc)})") from None
    except (ValueError, pd.errors.ParserError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidArgument(f"{where} is not a readable CSV table ({reason(exc)})") from None


#: Rules for the values of a free-form table's columns (a training run's CSVs, telemetry records):
#: what a message says is allowed, and which numbers break it, or the allowed spellings of a text
#: rule. A loss may be nan or inf: that is what fp16 training does.
VALUE_RULES: dict[str, tuple[str, Callable[[pd.Series], pd.Series] | tuple[str, ...]]] = {
    "count": ("non-negative integers", lambda v: v.isna() | (v < 0) | (v % 1 != 0)),
    "number": ("numbers (nan and inf included)", lambda v: pd.Series(False, index=v.index)),
    "positive": ("positive finite numbers", lambda v: ~((v > 0) & np.isfinite(v))),
    "fraction": ("fractions from 0 to 1", lambda v: ~((v >= 0) & (v <= 1))),
    "bool": ("True or False", ("True", "False")),
    "kind": ("weight or activation", ("weight", "activation")),
}


def check_values(frame: pd.DataFrame, rules: Mapping[str, str], *, where: str) -> None:
    """One InvalidArgument line naming the first row whose value in a column of `rules` (those
    present) breaks its rule of `VALUE_RULES`: a word, or true/false, where a number belongs included."""
    for column, rule in rules.items():
        if column not in frame.columns:
            continue
        series = frame[column]
        allowed, test = VALUE_RULES[rule]
        if isinstance(test, tuple):
            bad = ~series.astype(str).isin(test)
        elif series.dtype == bool:
            bad = pd.Series(True, index=series.index)
        else:  # through text: words become NaN, an integer too large for a float inf (not an OverflowError)
            values = pd.to_numeric(series.astype(str), errors="coerce").astype("float64")
            bad = (values.isna() & series.notna()) | test(values)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy(dtype=bool))[0])
            value = series.iloc[row]
            shown = show(value.item() if isinstance(value, np.generic) else value)
            raise InvalidArgument(f"{where}: column {column!r} must hold {allowed}; row {row} holds {shown}")


def add_bounds(
    df: pd.DataFrame,
    accumulator: str = "fp16",
    *,
    lam: float = DEFAULT_LAMBDA,
    output: str | None = None,
) -> pd.DataFrame:
    """Fill a sweep frame's bound columns for the hypothesis "accumulates in `accumulator`".

    gamma_bound is gamma_K(u) (NaN where K u >= 1: no information),
    probabilistic_bound is lambda sqrt(K) u; both plus the output rounding when
    `output` is given (see `bounds.dot_error_bound`). exceeds_probabilistic
    compares max_abs_sum_error with the probabilistic bound (empty where no
    error was measured).
    """
    frame = validate_frame(df, SWEEP_SCHEMA)
    acc = parse_format(accumulator, argument="accumulator")
    k = frame["k"].to_numpy(dtype=np.float64)
    measured = k >= 1  # rows of failed runs carry k = 0 and get no bound
    defined = measured & (k * acc.unit_roundoff < 1.0)
    gam = np.full(k.shape, np.nan)
    prob = np.full(k.shape, np.nan)
    if defined.any():
        gam[defined] = dot_error_bound(k[defined].astype(np.int64), acc, "deterministic", output=output)
    if measured.any():
        prob[measured] = dot_error_bound(k[measured].astype(np.int64), acc, "probabilistic", lam=lam,
                                         output=output)
    frame["bound_format"] = pd.Series([acc.name] * len(frame), index=frame.index, dtype="str")
    frame["lam"] = float(lam)
    frame["gamma_bound"] = np.asarray(gam, dtype=np.float64)
    frame["probabilistic_bound"] = np.asarray(prob, dtype=np.float64)
    err = frame["max_abs_sum_error"]
    exceeds = (err > frame["probabilistic_bound"]).astype("boolean")
    frame["exceeds_probabilistic"] = exceeds.where(err.notna(), pd.NA)
    return frame


#: Short column titles of the fingerprint table (the JSON keeps the full property names).
FINGERPRINT_TITLES = {
    "accumulation": "accumulation", "accumulator_bits": "acc bits", "extra_bits": "extra",
    "rounding": "rounding", "double_rounding": "2x round", "product_bits": "products",
    "subnormal_inputs": "subn in", "subnormal_results": "subn out", "overflow": "overflow",
    "accumulator_range": "acc range", "product_overflow": "65519 test", "block_size": "block",
    "chunk_size": "chunk",
}


def fingerprint_table(df: pd.DataFrame, properties: Iterable[str] | None = None) -> pd.DataFrame:
    """Wide view of probe rows: one row per configuration x op, one column per property.

    A configuration that did not run shows its status ("crashed", ...) in every
    cell, so the table never silently drops a row. Column order follows
    `properties` if given, else first appearance.
    """
    frame = validate_frame(df, PROBE_SCHEMA)
    if properties is None:
        props = list(dict.fromkeys(frame["property"]))
    else:
        props = list(properties)
    keys = ["configuration", "op"]
    order = list(dict.fromkeys(zip(frame["configuration"], frame["op"])))
    cells: dict[tuple[str, str], dict[str, str]] = {key: {} for key in order}
    statuses: dict[tuple[str, str], str] = {}
    for row in frame.itertuples(index=False):
        key = (row.configuration, row.op)
        if row.status == "ok":
            cells[key][row.property] = str(row.value)
        else:
            statuses.setdefault(key, row.status)
    records = []
    for key in order:
        record = dict(zip(keys, key))
        for prop in props:
            record[prop] = cells[key].get(prop, statuses.get(key, "-"))
        records.append(record)
    return pd.DataFrame(records, columns=keys + props).astype("str")
