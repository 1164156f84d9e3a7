"""identify's battery call: seeded random dot products per K through every op of every
configuration, each configuration in its own process (`convprobe.probes.runner`), and
the model that matches best, tabulated (`Outcome`)."""

from __future__ import annotations

from convprobe.analysis.tables import frame_from_records
from convprobe.identify import battery
from convprobe.identify.direct_sum import DirectSum
from convprobe.options import Status
from convprobe.probes.runner import run_probe
from convprobe.probes.studies import Outcome, envelope, failure_notes
from convprobe.render import share_text

__all__ = ["run_identify"]


def run_identify(configs, ops, *, specs, ks=None, rows: int, seed: int, device: str, timeout: float,
                 jobs: int | None) -> Outcome:
    """Seeded random dot products per K through every op, and the model that matches best."""
    params = {"ops": list(ops), "ks": None if ks is None else list(ks), "rows": rows, "seed": seed}
    probe_results = run_probe(battery.__name__, configs, params, timeout=timeout, jobs=jobs, name="identify")
    if ks is None:  # each op's own Ks (`identify.default_ks`): a column for any of them
        ks = battery.battery_ks(ops)
    table_rows, records, matches = [], [], {}
    for result in probe_results:
        per_op = battery.identify_observed(result.observed, specs) if result.status == Status.OK else {}
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
    ks_by_op = {op: battery.ks_for(op, params["ks"]) for op in ops}  # what "ks": null resolved to
    document = envelope("identify", {**params, "ks_by_op": ks_by_op}, probe_results, seed=seed, device=device,
                         matches=matches)
    notes = ["(match = share of outputs bitwise equal to the best single model's, rounded down (100.0% only when "
             "every output matched), in brackets the K's own "
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
        row[f"K={k}"] = share_text(fraction)
        if k in per_k and per_k[k]["fraction"] > fraction:  # a K-specific model does better
            row[f"K={k}"] += f" ({share_text(per_k[k]['fraction'])})"
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
        records.append({**base, **ok, "property": f"match_fraction_k{k}", "value": repr(float(fraction)),
                        "evidence": f"{summary['best']} vs observed, {rows} outputs"})
    for k, entry in per_k.items():
        evidence = (DirectSum.from_dict(evidence_at[k]).reason if k in not_direct else
                    f"{float(entry['fraction'])!r} of {rows} outputs; measured: "
                    f"{', '.join(entry['measured']) or 'no structure'}")
        records.append({**base, **ok, "property": f"model_k{k}", "value": entry["best"], "evidence": evidence})
    return records
