"""The results envelope: what every file convprobe writes looks like, and its history.

Every command's document (overflow, compare, fingerprint, identify, sweep, replay,
train's ``header.json`` and ``summary.json``, and a training comparison's
``comparison.json``) is one JSON object::

    {"schema_version": 2, "kind": "...", "params": {...}, "provenance": {...}, ...}

plus the fields its kind requires (each kind's validator below names them). `envelope` builds one, `write`
validates and writes it, `read` reads, upgrades an older version and validates it
completely: a malformed document is one `InvalidArgument` line naming the field,
never a TypeError later. (Table rows are checked against the analysis layer's
schemas, `convprobe.analysis.tables`, imported only when a document holds a table.) Like pyperf's format, the version moves when the layout
changes, `SCHEMA_HISTORY` says what changed, and older documents are upgraded on read.
"""

from __future__ import annotations

import json
import re
import reprlib
import sys
from enum import StrEnum
from pathlib import Path

from convprobe.errors import InvalidArgument, invalid_choice, is_integer, reason
from convprobe.options import ComputeDtype, LossScaleMode, Status
from convprobe import files
from convprobe.render import json_clean, render_json, write_atomic

__all__ = ["SCHEMA_VERSION", "SCHEMA_HISTORY", "Kind", "COMPARISON_FILE", "envelope", "validate", "read", "write", "upgrade",
           "regular_file", "read_json", "reason", "show"]

SCHEMA_VERSION = 2

#: What each version changed (read by `upgrade`, shown by the docs).
SCHEMA_HISTORY = {
    1: "First format (convprobe 0.1). overflow and compare named their probe in 'probe', the other "
       "commands in 'kind'; train's header.json and summary.json carried no version or kind.",
    2: "One envelope for every command: every document has schema_version, kind, params and "
       "provenance. train's header.json is kind 'train' with the run configuration in 'params' (was "
       "'config'); summary.json is kind 'train-summary' with the summary in 'summary'. Version-1 "
       "documents are upgraded on read. Later within version 2, a new kind and no layout change: "
       "'train-comparison' (convprobe train --arm ..., DIR/comparison.json): per (arm, seed) run its "
       "status and final numbers in 'runs', per arm mean and sample std in 'arms'. Later still, no "
       "layout change: a 'train' run's steps.csv gained nonfinite_tensors and first_nonfinite, its "
       "telemetry.csv the counterfactual columns bf16_/fp8_e4m3_/fp8_e5m2_{flushed,subnormal}_fraction "
       "(header.json's 'columns' lists what a run holds; an older run is still read, not resumed); a "
       "'train' header may come from the Keras callback convprobe.training.UnderflowTelemetry "
       "(params.source 'keras-callback'). Later still, no layout change: each result's 'config' carries "
       "its backend's fields only - tensorflow: device, env, jit_compile; jax and torch: device, env, options; "
       "emulated: model (no device 'emulated', and accumulate null where a model was named, was "
       "'model'). An older config is still read. Later still, a new kind and no layout change: 'contract' "
       "(convprobe contract): the fingerprint results in 'results', and per (configuration, op) what was "
       "declared and observed, with the verdict and its evidence, in 'cells'. Later still, no layout change: "
       "an identify document's per-op results gain 'zero_sign_bits' (the op's outputs where every product "
       "is -2**-48), and model specs may carry zeros=positive; an older document is read as before. Later, "
       "no layout change: a layer identify document's params gain 'trees' (needed or always), and an op's "
       "trees may be empty with a note that names the spec that made them unnecessary, recorded as the op's "
       "'settled' spec (null where the trees were recovered).",
}


class Kind(StrEnum):
    """The kinds of result document, one per command (two for a training run)."""

    OVERFLOW = "overflow"
    COMPARE = "compare"
    FINGERPRINT = "fingerprint"
    IDENTIFY = "identify"
    CONTRACT = "contract"
    SWEEP = "sweep"
    REPLAY = "replay"
    TRAIN = "train"
    TRAIN_SUMMARY = "train-summary"
    TRAIN_COMPARISON = "train-comparison"


#: Where a training comparison's document lives in its directory (`convprobe train --arm ... --output DIR`).
COMPARISON_FILE = "comparison.json"

#: The fields of a training summary and what each must hold.
SUMMARY_FIELDS = {
    "finished": "bool", "final_step": "count", "skipped_steps": "count", "nonfinite_steps": "count",
    "final_loss_scale": "number?", "final_loss": "number?", "eval_accuracy": "number?",
    "median_images_per_second": "number?", "jit": "bool",
}


def envelope(kind: str, params: dict, provenance: dict, **fields) -> dict:
    """A document of `kind` in the current version (validate it with `validate` or `write`)."""
    return {"schema_version": SCHEMA_VERSION, "kind": str(Kind(kind)), "params": params,
            "provenance": provenance, **fields}


def write(path: str | Path, document: dict) -> None:
    """Validate `document` and write it atomically as strict JSON (non-finite floats as strings)."""
    text = render_json(json_clean(document))
    validate(json.loads(text), where=str(path))  # exactly what a reader will see
    write_atomic(str(path), text)


def read(path: str | Path, kinds: tuple[str, ...] | None = None) -> dict:
    """The validated document at `path`, upgraded to the current version; one InvalidArgument
    line for a missing, unreadable or malformed file, or one of another kind than `kinds`."""
    p = Path(path)
    document = upgrade(read_json(p, where=f"results file {str(p)!r}"), where=str(p))
    kind = document.get("kind")
    if kinds is not None and kind not in kinds:  # before its fields are checked as that other kind's
        found = f"a {str(kind)!r} document" if isinstance(kind, str) else "no document kind"
        raise InvalidArgument(f"{p} holds {found}; expected {' or '.join(repr(str(k)) for k in kinds)}")
    return validate(document, where=str(p))


# -- reading files -----------------------------------------------------------------------


def regular_file(path: str | Path, *, where: str) -> Path:
    """`path` if it is a regular file (or a link to one) that can be read; one InvalidArgument
    line otherwise (`files.check_input_file`; an empty file is the reader's to describe).
    Checked before opening: a FIFO would block the reader forever."""
    return files.check_input_file(path, where, allow_empty=True)


class _RepeatedKey(ValueError):
    """A JSON object that gives one key twice (Python's reader would keep the last silently)."""


def _object_once(pairs: list[tuple[str, object]]) -> dict:
    document: dict = {}
    for key, value in pairs:
        if key in document:
            raise _RepeatedKey(key)
        document[key] = value
    return document


def read_json(path: str | Path, *, where: str) -> object:
    """The JSON value in the file at `path` (a UTF-8 byte order mark is allowed): one
    InvalidArgument line for anything else, a document nested too deeply for the parser included."""
    p = regular_file(path, where=where)
    try:
        text = p.read_bytes().decode("utf-8-sig")
        return json.loads(text, object_pairs_hook=_object_once)
    except _RepeatedKey as exc:
        raise InvalidArgument(f"{where} is not a usable JSON document (it gives the key {exc.args[0]!r} twice in "
                              f"one object; JSON readers differ on which one counts)") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{where} is not valid JSON ({reason(exc)})") from None
    except OSError as exc:
        raise InvalidArgument(f"{where} cannot be read ({reason(exc)})") from None
    except (RecursionError, ValueError) as exc:  # nesting beyond the stack; a number of > 4300 digits
        raise InvalidArgument(f"{where} is not a readable JSON document ({reason(exc).split(';')[0]})") from None


def upgrade(document, *, where: str) -> dict:
    """`document` in the current version (version-1 layouts rewritten per `SCHEMA_HISTORY`)."""
    if not isinstance(document, dict):
        raise InvalidArgument(f"{where}: a convprobe result must be a JSON object; received "
                              f"{type(document).__name__}")
    version = document.get("schema_version")
    if not is_integer(version) and version is not None:
        return document  # `validate` names it: true == 1 and 1.0 == 1 in Python, but not versions
    if version is None and "config" in document and "columns" in document:  # v1 train header
        version = 1
    if version is None and "final_step" in document and "jit" in document:  # v1 train summary
        version = 1
    if version == 1:
        document = dict(document)
        if "kind" not in document and "probe" in document:
            document["kind"] = document.pop("probe")
        elif "config" in document and "columns" in document:
            document = {"kind": "train", "params": document.pop("config"), **document}
        elif "final_step" in document:
            provenance = document.pop("provenance", {})
            document = {"kind": "train-summary", "params": {}, "provenance": provenance,
                        "summary": {k: v for k, v in document.items() if k != "schema_version"}}
        document.setdefault("params", {})
        document["schema_version"] = SCHEMA_VERSION
    return document


# -- validation --------------------------------------------------------------------------


def show(value) -> str:
    """A received value as a message quotes it: JSON (a string in quotes), cut at 60 characters."""
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (RecursionError, ValueError, TypeError):  # nested deeper than the encoder goes; not JSON
        text = reprlib.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Checker:
    """Field checks that name the path of what is wrong: ``results[2].status``."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, what: str, value) -> None:
        raise InvalidArgument(f"{self.where}: {path} must be {what}; received {show(value)}")

    def get(self, mapping: dict, key: str, path: str, what: str):
        if key not in mapping:
            raise InvalidArgument(f"{self.where}: {path}{'.' if path else ''}{key} is missing (it must be {what})")
        return mapping[key]

    def check(self, value, kind: str, path: str):
        """`kind`: object, list, str, bool, int, count (int >= 0), number, strings, ints, numbers;
        a trailing '?' allows null."""
        nullable = kind.endswith("?")
        kind = kind.rstrip("?")
        if nullable and value is None:
            return value
        ok = {
            "object": lambda v: isinstance(v, dict),
            "list": lambda v: isinstance(v, list),
            "str": lambda v: isinstance(v, str),
            "bool": lambda v: isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "number": _is_number,
            "strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
            "ints": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
            "numbers": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
            "values": lambda v: isinstance(v, list) and all(isinstance(x, str) and _is_value_text(x) for x in v),
            "fraction": lambda v: _is_number(v) and 0 <= float(v) <= 1,
            "ulps": lambda v: isinstance(v, list) and all(_is_number(x) and float(x) >= 0 for x in v),
        }[kind](value)
        if not ok:
            self.fail(path, _WHAT[kind] + (" or null" if nullable else ""), value)
        return value

    def field(self, mapping: dict, key: str, kind: str, path: str = ""):
        value = self.get(mapping, key, path, _WHAT[kind.rstrip("?")])
        return self.check(value, kind, f"{path}{'.' if path else ''}{key}")

    def choice(self, mapping: dict, key: str, choices: tuple, path: str = ""):
        """A string field that must be one of `choices` (the `invalid_choice` message)."""
        value = self.field(mapping, key, "str", path)
        if value not in choices:
            raise invalid_choice(f"{self.where}: {path}{'.' if path else ''}{key}", value, choices)
        return value


_WHAT = {"object": "an object", "list": "a list", "str": "a string", "bool": "true or false",
         "int": "an integer", "count": "a non-negative integer", "number": "a number",
         "strings": "a list of strings", "ints": "a list of integers", "numbers": "a list of numbers",
         "values": "a list of output values as text ('inf', 'nan', '0.0', ...)",
         "fraction": "a fraction from 0 to 1",
         "ulps": "a list of ULP errors, each a number >= 0 or inf (never NaN)"}


def _is_number(value) -> bool:
    """A JSON number a float can hold (readers compute with floats: 1e400 written as an integer
    is no number to them), or a non-finite float that `json_clean` wrote as its repr string."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= sys.float_info.max
    if isinstance(value, float):
        return True
    return isinstance(value, str) and value in ("inf", "-inf", "nan")


def _is_value_text(text: str) -> bool:
    """An output value as `encode_values` writes it: a float's text."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def validate(document, *, where: str) -> dict:
    """`document` unchanged if it is a well-formed current-version envelope of its kind;
    otherwise one InvalidArgument line naming the first wrong field."""
    c = _Checker(where)
    if not isinstance(document, dict):
        c.fail("the document", "a JSON object", type(document).__name__)
    version = c.get(document, "schema_version", "", f"the integer {SCHEMA_VERSION}")
    if not is_integer(version):
        c.fail("schema_version", f"an integer, one of the versions {', '.join(map(str, SCHEMA_HISTORY))}",
               version)
    if version != SCHEMA_VERSION:
        known = ", ".join(map(str, SCHEMA_HISTORY))
        raise InvalidArgument(f"{where}: schema_version {show(version)} is not one this convprobe reads "
                              f"(versions {known}; see convprobe.results.SCHEMA_HISTORY)")
    kind = Kind(c.choice(document, "kind", tuple(Kind)))
    c.field(document, "params", "object")
    c.field(document, "provenance", "object")
    _VALIDATORS[kind](c, document)
    return document


def _probe_records(c: _Checker, document: dict, probe_name: Kind | None = None) -> None:
    """The probe results (each named `probe_name`, by default the document's kind)."""
    kind = probe_name or Kind(document["kind"])
    for i, record in enumerate(c.field(document, "results", "list")):
        path = f"results[{i}]"
        c.check(record, "object", path)
        probe = c.field(record, "probe", "str", path)
        if probe != kind:
            c.fail(f"{path}.probe", repr(kind), probe)
        status = c.choice(record, "status", tuple(Status), path)
        config = c.field(record, "config", "object", path)
        c.field(config, "label", "str", f"{path}.config")
        c.field(config, "backend", "str", f"{path}.config")
        observed = c.field(record, "observed", "object", path)
        c.field(record, "error", "str?", path)
        c.field(record, "accumulation", "str?", path)
        if status == Status.OK:
            _OBSERVED.get(kind, lambda *_: None)(c, observed, f"{path}.observed")


def _overflow_observed(c: _Checker, observed: dict, path: str) -> None:
    c.field(observed, "output", "values", path)


def _compare_observed(c: _Checker, observed: dict, path: str) -> None:
    c.field(observed, "max_abs_diff", "number", path)
    c.field(observed, "fraction_different", "fraction", path)
    for side in ("real", "fake"):
        c.field(c.field(observed, side, "object", path), "max_ulp_error", "number", f"{path}.{side}")


_OBSERVED = {Kind.OVERFLOW: _overflow_observed, Kind.COMPARE: _compare_observed}


def _table(c: _Checker, document: dict, schema: str) -> None:
    import pandas as pd

    from convprobe.table_schemas import SCHEMAS, validate_frame  # pandas: only when a table is read

    table = c.field(document, "table", "object")
    if c.field(table, "schema", "str", "table") != schema:
        c.fail("table.schema", repr(schema), table["schema"])
    rows = c.field(table, "rows", "list", "table")
    for i, row in enumerate(rows):
        c.check(row, "object", f"table.rows[{i}]")
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(SCHEMAS[schema].names))
    validate_frame(frame, schema, where=f"{c.where}: table")


def _fingerprint(c: _Checker, document: dict) -> None:
    _probe_records(c, document)
    _table(c, document, "probe")


def _contract(c: _Checker, document: dict) -> None:
    _probe_records(c, document, Kind.FINGERPRINT)
    for i, cell in enumerate(c.field(document, "cells", "list")):
        path = f"cells[{i}]"
        c.check(cell, "object", path)
        for key in ("framework", "configuration", "switches", "op", "verdict", "evidence"):
            c.field(cell, key, "str", path)
        for key in ("declared", "observed"):
            c.field(cell, key, "str?", path)


def _identify(c: _Checker, document: dict) -> None:
    _probe_records(c, document)
    for label, per_op in c.field(document, "matches", "object").items():
        c.check(per_op, "object", f"matches[{label!r}]")
        for op, entry in per_op.items():
            path = f"matches[{label!r}][{op!r}]"
            c.check(entry, "object", path)
            status = c.field(entry, "status", "str", path)
            if status != Status.OK:
                continue
            summary = c.field(entry, "summary", "object", path)
            c.field(summary, "best", "str?", f"{path}.summary")
            fractions = c.field(summary, "fractions", "object", f"{path}.summary")
            for k, fraction in fractions.items():
                if not k.isdigit():
                    c.fail(f"{path}.summary.fractions", "keyed by reduction lengths K", k)
                c.check(fraction, "fraction", f"{path}.summary.fractions[{k!r}]")


def _sweep(c: _Checker, document: dict) -> None:
    _probe_records(c, document)
    _table(c, document, "sweep")
    for label, per_op in c.field(document, "ulp_errors", "object").items():
        c.check(per_op, "object", f"ulp_errors[{label!r}]")
        for op, per_dist in per_op.items():
            c.check(per_dist, "object", f"ulp_errors[{label!r}][{op!r}]")
            for dist, entry in per_dist.items():
                path = f"ulp_errors[{label!r}][{op!r}][{dist!r}]"
                c.check(entry, "object", path)
                c.field(entry, "k", "count", path)
                c.field(entry, "ulp_errors", "ulps", path)


def _replay(c: _Checker, document: dict) -> None:
    for i, row in enumerate(c.field(document, "results", "list")):
        path = f"results[{i}]"
        c.check(row, "object", path)
        for key in ("gpu", "input", "output", "model"):
            c.field(row, key, "str", path)
        c.field(row, "k", "count", path)
        vectors = c.field(row, "vectors", "count", path)
        matches = c.field(row, "matches", "count", path)
        if matches > vectors:
            c.fail(f"{path}.matches", f"at most vectors ({vectors})", matches)
        mismatch = c.field(row, "first_mismatch", "object?", path)
        if mismatch is not None:
            c.field(mismatch, "index", "count", f"{path}.first_mismatch")


#: The record columns every training run has, in any version (what readers may rely on).
RUN_COLUMNS = {"steps": ("step", "loss", "loss_scale", "skipped"),
               "telemetry": ("step", "kind", "index", "layer", "flushed_fraction", "subnormal_fraction")}


def _train(c: _Checker, document: dict) -> None:
    params = document["params"]
    c.choice(params, "dtype", tuple(ComputeDtype), "params")
    c.field(params, "steps", "count", "params")
    c.choice(c.field(params, "loss_scale", "object", "params"), "mode", tuple(m.value for m in LossScaleMode),
             "params.loss_scale")
    columns = c.field(document, "columns", "object")
    for name in ("steps", "telemetry"):
        listed = c.field(columns, name, "strings", "columns")
        missing = [column for column in RUN_COLUMNS[name] if column not in listed]
        if missing:
            c.fail(f"columns.{name}", f"a list holding {', '.join(RUN_COLUMNS[name])}", listed)
    layers = c.field(document, "layers", "object")
    for name in ("weight", "activation"):
        c.field(layers, name, "strings", "layers")
    resumed = c.field(document, "resumed_at_steps", "ints")
    if any(step < 0 for step in resumed):
        c.fail("resumed_at_steps", "a list of non-negative steps", resumed)
    c.field(document, "histogram_bins", "ints")


def _train_summary(c: _Checker, document: dict) -> None:
    summary = c.field(document, "summary", "object")
    for key, kind in SUMMARY_FIELDS.items():
        c.field(summary, key, kind, "summary")


#: What each run row and each arm row of a training comparison must hold.
COMPARISON_RUN_FIELDS = {
    "arm": "str", "seed": "count", "directory": "str", "error": "str?", "reused": "bool", "jit": "bool",
    "eval_accuracy": "fraction?", "final_loss": "number?", "skipped_steps": "count?", "nonfinite_steps": "count?",
    "final_step": "count?", "underflow": "object?", "seconds": "number?",
}
COMPARISON_ARM_FIELDS = {
    "arm": "str", "runs": "count", "finished": "count", "eval_accuracy_mean": "fraction?",
    "eval_accuracy_std": "number?", "final_loss_mean": "number?", "final_loss_std": "number?",
    "skipped_steps": "count",
}
COMPARISON_UNDERFLOW_FIELDS = {"step": "count", "weight_mean": "fraction?", "activation_mean": "fraction?",
                               "worst": "fraction", "worst_tensor": "str"}


#: A run's directory in a comparison: one plain name, `<arm name>_seed<k>` (`Arm.run_name`).
_RUN_DIRECTORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*_seed([0-9]+)")


def _train_comparison(c: _Checker, document: dict) -> None:
    """A comparison is checked against itself too: one row per arm at each seed, each once, in a
    directory of its own inside the comparison, and arm rows that count exactly those runs."""
    arms = c.field(document["params"], "arms", "strings", "params")
    seeds = c.field(document["params"], "seeds", "ints", "params")
    for key, values in (("arms", arms), ("seeds", seeds)):
        if len(set(values)) != len(values):
            c.fail(f"params.{key}", "a list naming each once", values)
    seen: dict[tuple, str] = {}
    directories: dict[str, str] = {}
    stems: dict[str, tuple[str, str]] = {}  # per arm: the directory name before _seed<k>, and its first row
    for i, row in enumerate(c.field(document, "runs", "list")):
        path = f"runs[{i}]"
        c.check(row, "object", path)
        for key, kind in COMPARISON_RUN_FIELDS.items():
            c.field(row, key, kind, path)
        c.choice(row, "status", tuple(Status), path)
        if row["arm"] not in arms:
            c.fail(f"{path}.arm", f"one of params.arms ({', '.join(arms)})", row["arm"])
        if row["seed"] not in seeds:
            c.fail(f"{path}.seed", f"one of params.seeds ({', '.join(map(str, seeds))})", row["seed"])
        if (row["arm"], row["seed"]) in seen:
            c.fail(path, f"the only run of arm {row['arm']} at seed {row['seed']} (it repeats "
                   f"{seen[row['arm'], row['seed']]})", row["directory"])
        seen[row["arm"], row["seed"]] = path
        name = _RUN_DIRECTORY.fullmatch(row["directory"])
        if name is None or int(name.group(1)) != row["seed"]:
            c.fail(f"{path}.directory", f"a run directory inside the comparison named <arm>_seed{row['seed']}",
                   row["directory"])
        stem = row["directory"][: -len(f"_seed{row['seed']}")]
        first_stem, first = stems.setdefault(row["arm"], (stem, path))
        if first_stem != stem or sum(other == stem for other, _ in stems.values()) > 1:
            c.fail(f"{path}.directory", f"named like the other runs of arm {row['arm']} ({first_stem}_seed<k>, "
                   f"as {first}) and unlike any other arm's", row["directory"])
        if row["directory"] in directories:
            c.fail(f"{path}.directory", f"a directory of its own (it repeats {directories[row['directory']]})",
                   row["directory"])
        directories[row["directory"]] = path
        if row["underflow"] is not None:
            for key, kind in COMPARISON_UNDERFLOW_FIELDS.items():
                c.field(row["underflow"], key, kind, f"{path}.underflow")
    missing = [f"{arm} at seed {seed}" for arm in arms for seed in seeds if (arm, seed) not in seen]
    if missing:
        raise InvalidArgument(f"{c.where}: runs must hold one row for each arm at each seed; none is there for "
                              f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    runs = document["runs"]
    listed = []
    for i, row in enumerate(c.field(document, "arms", "list")):
        path = f"arms[{i}]"
        c.check(row, "object", path)
        for key, kind in COMPARISON_ARM_FIELDS.items():
            c.field(row, key, kind, path)
        mine = [run for run in runs if run["arm"] == row["arm"]]
        if row["runs"] != len(mine):
            c.fail(f"{path}.runs", f"the number of its rows in runs ({len(mine)})", row["runs"])
        finished = sum(run["status"] == Status.OK for run in mine)
        if row["finished"] != finished:
            c.fail(f"{path}.finished", f"the number of its runs with status ok ({finished})", row["finished"])
        listed.append(row["arm"])
    if listed != arms:
        c.fail("arms", f"one row per arm of params.arms, in order ({', '.join(arms)})", listed)


_VALIDATORS = {
    Kind.OVERFLOW: _probe_records, Kind.COMPARE: _probe_records, Kind.FINGERPRINT: _fingerprint,
    Kind.IDENTIFY: _identify, Kind.CONTRACT: _contract, Kind.SWEEP: _sweep, Kind.REPLAY: _replay, Kind.TRAIN: _train,
    Kind.TRAIN_SUMMARY: _train_summary, Kind.TRAIN_COMPARISON: _train_comparison,
}

assert set(_VALIDATORS) == set(Kind), "every kind needs its validator"
