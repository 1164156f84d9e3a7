"""Each command's library call: run a probe over configurations and tabulate the answer.

`run_classic` (overflow, compare), `run_fingerprint`, `run_identify` and `run_sweep`
each return an `Outcome`: the results envelope (`convprobe.results`) to write, the
rows and columns to display, the tidy frame behind a CSV, and the notes that go under
a table. The command modules in `convprobe.cli` only parse, call one of these, render.
identify's layer mode has its call with its machinery (`convprobe.identify.layer_study`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from convprobe import provenance, results
from convprobe.options import Status
from convprobe.probes.direct_sum import DirectSum

__all__ = ["Outcome", "envelope", "failure_notes", "run_classic", "run_fingerprint", "run_identify", "run_sweep",
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


def run_identify(configs, ops, *, specs, ks=None, rows: int, seed: int, device: str, timeout: float,
                 jobs: int | None) -> Outcome:
    """Seeded random dot products per K through every op, and the model that matches best."""
    from convprobe.analysis.tables import frame_from_records
    from convprobe.probes import identify
    from convprobe.probes.runner import run_probe

    params = {"ops": list(ops), "ks": None if ks is None else list(ks), "rows": rows, "seed": seed}
    probe_results = run_probe("identify", configs, params, timeout=timeout, jobs=jobs)
    if ks is None:  # each op's own Ks (`identify.default_ks`): a column for any of them
        ks = identify.battery_ks(ops)
    table_rows, records, matches = [], [], {}
    for result in probe_results:
        per_op = identify.identify_observed(result.observed, specs) if result.status == Status.OK else {}
        matches[result.config.label] = {
            op: {"status": e["status"], "error": e["error"], "summary": e["summary"],
                 "table": {n: {str(k): f for k, f in fr.items()} for n, fr in e["table"].items()}}
            for op, e in per_op.items()}
        for op in ops:
            entry = per_op.get(op, {"status": result.status, "error": result.error, "summary": {}})
            base = {**result.identity(), "op": op, "probe": "identify", "seed": seed}
            row = {"configuration": result.config.label, "op": op, "status": entry["status"]}
            table_rows.append(row)
            if entry["status"] != Status.OK:
                row["best model"] = entry.get("error") or entry["status"]
                records.append({**base, "property": "status", "value": None, "status": entry["status"],
                                "detail": entry.get("error"), "evidence": None})
                continue
            records.extend(_battery_summary(row, base, entry["summary"], rows))
    frame = frame_from_records(records, "probe")
    columns = ["configuration", "op", "status", "best model", "stops at K", *(f"K={k}" for k in ks), "ties",
               "every K (own model)"]
    ks_by_op = {op: identify.ks_for(op, params["ks"]) for op in ops}  # what "ks": null resolved to
    document = envelope("identify", {**params, "ks_by_op": ks_by_op}, probe_results, seed=seed, device=device,
                         matches=matches)
    notes = ["(match = share of outputs bitwise equal to the best single model's, in brackets the K's own "
             "measured model where it does better; 'ties' = models matching at every K; 'every K (own "
             "model)' = Ks where the model measured at that K matches 100%: see per_k in the JSON; "
             "'not direct' = a K where the op is no direct sum of products: it gets no model, and the best "
             "model, its stop and its ties are over the other Ks)",
             *(n for n in failure_notes(probe_results) if ": note: " in n)]
    return Outcome(document, table_rows, columns, notes, frame, "probe", probe_results=probe_results)


def _battery_summary(row: dict, base: dict, summary: dict, rows: int) -> list[dict]:
    """One (configuration, op) of the battery: fills its table row, returns its records. A K
    where the op is not a direct sum reads "not direct", its record says why. Keys may be
    strings (a summary read back from JSON)."""
    records = []
    stop = summary["stops_matching_at"]
    not_direct = [int(k) for k in summary.get("not_direct_at") or []]
    evidence_at = {int(k): d for k, d in (summary.get("direct_per_k") or {}).items()}
    fractions = {int(k): f for k, f in summary["fractions"].items()}
    per_k = {int(k): e for k, e in (summary.get("per_k") or {}).items()}
    row["best model"] = summary["best"] or ("none: not a direct sum of products" if not_direct else None)
    row["stops at K"] = "-" if stop is None else stop
    for k, fraction in fractions.items():
        row[f"K={k}"] = f"{fraction:.0%}"
        if k in per_k and per_k[k]["fraction"] > fraction:  # a K-specific model does better
            row[f"K={k}"] += f" ({per_k[k]['fraction']:.0%})"
    for k in not_direct:
        row[f"K={k}"] = "not direct"
    row["ties"] = len(summary["perfect"]) if summary["perfect"] else 0
    direct = [e for k, e in per_k.items() if k not in not_direct]
    exact = sum(e["fraction"] == 1.0 for e in direct)
    row["every K (own model)"] = (("100%" if direct and exact == len(direct) else f"{exact}/{len(direct)} K")
                                  + (f" ({len(not_direct)} not direct)" if not_direct else ""))
    ok = {"status": Status.OK.value, "detail": None}
    records.append({**base, **ok, "property": "best_model", "value": summary["best"],
                    "evidence": f"most bitwise matches over K = {', '.join(map(str, fractions))}"})
    records.append({**base, **ok, "property": "stops_matching_at", "value": "-" if stop is None else str(stop),
                    "evidence": "first K with a match fraction below 1"})
    for k, fraction in fractions.items():
        records.append({**base, **ok, "property": f"match_fraction_k{k}", "value": f"{fraction:.6g}",
                        "evidence": f"{summary['best']} vs observed, {rows} outputs"})
    for k, entry in per_k.items():
        evidence = (DirectSum.from_dict(evidence_at[k]).reason if k in not_direct else
                    f"{entry['fraction']:.6g} of {rows} outputs; measured: "
                    f"{', '.join(entry['measured']) or 'no structure'}")
        records.append({**base, **ok, "property": f"model_k{k}", "value": entry["best"], "evidence": evidence})
    return records


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
