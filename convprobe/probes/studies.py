"""Each command's library call: run a probe over configurations and tabulate the answer.

`run_classic` (overflow, compare), `run_fingerprint` and `run_sweep`
each return an `Outcome`: the results envelope (`convprobe.results`) to write, the
rows and columns to display, the tidy frame behind a CSV, and the notes that go under
a table. The command modules in `convprobe.cli` only parse, call one of these, render.
identify's calls live with its machinery (`convprobe.identify.battery_study`,
`convprobe.identify.layer_study`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from convprobe import provenance, results
from convprobe.options import Status

__all__ = ["Outcome", "envelope", "failure_notes", "run_classic", "run_fingerprint", "run_sweep",
           "run_replay",
           "CLASSIC_COLUMNS", "REPLAY_COLUMNS"]

#: The table columns of the two classic experiments (the CSV holds every row field).
CLASSIC_COLUMNS = {
    "overflow": ["configuration", "requested", "status", "output", "accumulation", "honoured", "arithmetic",
                 "environment"],
    "compare": ["configuration", "requested", "status", "accumulation", "honoured", "max_abs_diff",
                "fraction_different", "real_max_ulp", "fake_max_ulp", "verdict", "environment"],
}

@dataclass
class Outcome:
    """What a command shows and writes. `rows` are the display rows (`columns` their order),
    `notes` the indented lines under them; `frame` (with its `schema`) is the tidy table a CSV
    holds, else `csv_rows` are written."""

    document: dict
    rows: list[dict]
    columns: list[str]
    notes: list[str] = field(default_factory=list)
    frame: object = None
    schema: str | None = None
    csv_rows: list[dict] | None = None
    probe_results: list = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    summary: str | None = None  # a closing line under the table and its notes


def envelope(kind: str, params: dict, probe_results, *, seed: int | None, device: str, **fields) -> dict:
    """The results envelope (`convprobe.results`) of a command's probe results."""
    return results.envelope(kind, params, provenance.collect(seed=seed, device=device),
                            results=[r.to_record() for r in probe_results], **fields)


def _table(frame, schema: str) -> dict:
    return {"schema": schema, "rows": json.loads(frame.to_json(orient="records"))}


def failure_notes(probe_results) -> list[str]:
    """Lines under a table: each configuration's GPU-only-switch notes and failures."""
    notes = []
    for r in probe_results:
        notes += [f"{r.config.label}: note: {w}" for w in r.config.warnings]
        if r.status != Status.OK:
            notes.append(f"{r.config.label}: {r.status}: {r.error}")
    return notes


# -- overflow and compare ----------------------------------------------------------------


def run_classic(probe: str, configs, params: dict, *, device: str, timeout: float, jobs: int | None) -> Outcome:
    """The 65519 test or the real-vs-cast comparison on every configuration."""
    from convprobe.probes.runner import run_probe

    probe_results = run_probe(probe, configs, params, timeout=timeout, jobs=jobs)
    rows = []
    for result in probe_results:
        row = result.to_row()
        obs = result.observed
        if probe == "overflow":
            row["output"] = "[" + ", ".join(obs.get("output", [])) + "]" if obs else ""
        else:
            row["max_abs_diff"] = obs.get("max_abs_diff", "")
            row["fraction_different"] = obs.get("fraction_different", "")
            row["real_max_ulp"] = obs.get("real", {}).get("max_ulp_error", "")
            row["fake_max_ulp"] = obs.get("fake", {}).get("max_ulp_error", "")
        rows.append(row)
    notes = []
    for result in probe_results:
        notes += [f"{result.config.label}: note: {w}" for w in result.config.warnings]
        if result.status == Status.OK and result.evidence:
            notes.append(f"{result.config.label}: {result.evidence}")
        elif result.status != Status.OK and result.error:
            notes.append(f"{result.config.label}: {result.status}: {result.error}")
    document = envelope(probe, params, probe_results, seed=params["seed"], device=device)
    columns = CLASSIC_COLUMNS[probe]
    return Outcome(document, [{k: row[k] for k in columns} for row in rows], columns, notes,
                   csv_rows=rows, probe_results=probe_results)


# -- fingerprint -------------------------------------------------------------------------


def run_fingerprint(configs, ops, *, seed: int, device: str, timeout: float, jobs: int | None) -> Outcome:
    """The crafted-input battery on every configuration, one row per configuration x op."""
    from convprobe.analysis.tables import FINGERPRINT_TITLES, fingerprint_table, frame_from_records
    from convprobe.probes.fingerprint import PROPERTIES, infer_observed, run_grouped

    params = {"ops": list(ops), "seed": seed}
    probe_results = run_grouped(configs, params, timeout=timeout, jobs=jobs)
    records, evidence = [], []
    for result in probe_results:
        per_op = infer_observed(result.observed) if result.status == Status.OK else {}
        for op in ops:
            entry = per_op.get(op, {"status": result.status, "error": result.error, "properties": {}})
            base = {**result.identity(), "op": op, "probe": "fingerprint", "seed": seed}
            if entry["status"] != Status.OK:
                records.append({**base, "property": "status", "value": None, "status": entry["status"],
                                "detail": entry.get("error"), "evidence": None})
                continue
            for prop in PROPERTIES:
                cell = entry["properties"][prop]
                records.append({**base, "property": prop, "value": cell["value"], "evidence": cell["evidence"],
                                "status": Status.OK.value, "detail": None})
                evidence.append(f"{result.config.label} {op} {prop} = {cell['value']}: {cell['evidence']}")
    frame = frame_from_records(records, "probe")
    wide = fingerprint_table(frame, PROPERTIES)
    rows = [{FINGERPRINT_TITLES.get(k, k): v for k, v in row.items()} for row in wide.to_dict(orient="records")]
    columns = ["configuration", "op", *(FINGERPRINT_TITLES[p] for p in PROPERTIES)]
    document = envelope("fingerprint", params, probe_results, seed=seed, device=device,
                         table=_table(frame, "probe"))
    return Outcome(document, rows, columns, failure_notes(probe_results), frame, "probe",
                   probe_results=probe_results, evidence=evidence)


# -- identify ----------------------------------------------------------------------------


# -- sweep -------------------------------------------------------------------------------


def run_sweep(configs, ops, *, ks, distributions, rows: int, bound_format: str, seed: int, device: str,
              timeout: float, jobs: int | None) -> Outcome:
    """Error against the exact result versus K and input distribution, with its bounds."""
    from convprobe.analysis.tables import add_bounds, frame_from_records
    from convprobe.probes import sweep
    from convprobe.probes.runner import run_probe

    params = {"ops": list(ops), "ks": list(ks), "distributions": list(distributions), "rows": rows, "seed": seed}
    probe_results = run_probe("sweep", configs, params, timeout=timeout, jobs=jobs)
    records = [r for result in probe_results for r in sweep.records(result, seed)]
    frame = add_bounds(frame_from_records(records, "sweep"), bound_format)
    ulps = {r.config.label: {op: e.get("ulp_errors_at_largest_k", {}) for op, e in r.observed.get("ops", {}).items()}
            for r in probe_results if r.status == Status.OK}
    document = envelope("sweep", params, probe_results, seed=seed, device=device,
                         table=_table(frame, "sweep"), ulp_errors=ulps)
    for record in document["results"]:
        record["observed"] = {"summary": "see table"}  # the table holds every point; keep the file small
    table_rows = [{
        "configuration": rec["configuration"], "op": rec["op"], "status": rec["status"],
        "distribution": rec["distribution"], "K": rec["k"],
        "max err/sum|xw|": rec["max_abs_sum_error"], "median ulp": rec["median_ulp_error"],
        f"lambda*sqrt(K)*u ({bound_format})": rec["probabilistic_bound"],
        "exceeds": _flag(rec["exceeds_probabilistic"]), "stagnated": _flag(rec["stagnated"]),
    } for rec in frame.to_dict(orient="records")]
    columns = list(table_rows[0]) if table_rows else []
    return Outcome(document, table_rows, columns, failure_notes(probe_results), frame, "sweep",
                   probe_results=probe_results)


def _flag(value) -> str:
    import pandas as pd

    if value is None or value is pd.NA:
        return "-"
    try:
        if pd.isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    return "YES" if bool(value) else "no"


# -- replay ------------------------------------------------------------------------------

REPLAY_COLUMNS = ["gpu", "input", "output", "model", "k", "vectors", "matches", "first_mismatch"]


def run_replay(data: str | None, gpus: list[str] | None) -> Outcome:
    """Real tensor-core vectors (`data`, or the bundled copy) through the GPU presets
    (`Outcome.summary` counts the sets and vectors that match bit for bit)."""
    from convprobe.probes import replay

    sets = replay.load_directory(data, gpus) if data else replay.load_bundled(gpus)
    rows = replay.replay(sets)
    document = results.envelope("replay", {"data": data or "bundled", "gpu": gpus},
                                provenance.collect(seed=None, device="cpu"), results=rows)
    flat = [{**{k: r[k] for k in REPLAY_COLUMNS[:-1]}, "first_mismatch": _mismatch(r)} for r in rows]
    exact = sum(r["matches"] == r["vectors"] for r in rows)
    summary = (f"{exact} of {len(rows)} sets bit-exact; {sum(r['matches'] for r in rows)} of "
               f"{sum(r['vectors'] for r in rows)} vectors")
    return Outcome(document, flat, REPLAY_COLUMNS, csv_rows=flat, summary=summary)


def _mismatch(row: dict) -> str:
    m = row["first_mismatch"]
    return "-" if m is None else f"#{m['index']}: model {m['model']}, hardware {m['hardware']}"
