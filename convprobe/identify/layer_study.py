"""`convprobe identify`'s layer mode as a library call: run `layer_identify` over the
configurations and tabulate each layer's ops (an `Outcome`, as `convprobe.probes.studies`
returns for the other commands). The document is an ordinary identify document: kind
identify, its results named identify, params.layers."""

from __future__ import annotations

from typing import Any

from convprobe.identify import layer_identify
from convprobe.options import Status, TreeRecovery, parse_option
from convprobe.identify.direct_sum import not_direct
from convprobe.probes.layers import TRANSPOSED_SUFFIX
from convprobe.probes.runner import run_probe
from convprobe.probes.studies import Outcome, envelope, failure_notes
from convprobe.render import share_text

__all__ = ["NOT_IDENTIFIED", "run_layer_identify"]

#: The op column of a layer identify does not measure (its key names the layer's kind).
NOT_IDENTIFIED = "not identified"


def run_layer_identify(configs, layers, *, specs, seed: int, device: str, timeout: float,
                       jobs: int | None, not_identified=(), trees: TreeRecovery = TreeRecovery.NEEDED) -> Outcome:
    """Each layer's three ops at its own shape: measured structure, confirmed bit for bit; the
    model's conv-like layers identify cannot measure (`not_identified`) are rows that say why;
    `trees` says when the summation trees are recovered."""
    from convprobe.analysis.tables import frame_from_records

    params = {"layers": [layer.to_dict() for layer in layers], "seed": seed, "trees": parse_option("trees", trees, TreeRecovery).value,
              "not_identified": [item.to_dict() for item in not_identified]}
    # the layer mode is its own probe, run by module path; its rows are named identify's
    probe_results = run_probe(layer_identify.__name__, configs, params, timeout=timeout, jobs=jobs, name="identify")
    single = len(layers) == 1 and not not_identified  # a model's map keys every entry by its layer
    table_rows, records = [], []
    matches: dict[str, dict[str, dict[str, Any]]] = {}
    for result in probe_results:
        found = layer_identify.identify_observed(result.observed, specs) if result.status == Status.OK else [
            (layer, op, {"status": result.status, "error": result.error, "summary": {}})
            for layer in layers for op in layer.ops]
        per_op = matches[result.config.label] = {}
        for layer, op, entry in found:
            per_op[layer_identify.key(layer, op, single)] = {**entry, "layer": layer.to_dict(), "op": op}
            summary = entry["summary"]
            row = {"configuration": result.config.label, "layer": layer.name or layer.label, "op": op,
                   "K": layer.k(op), "status": entry["status"]}
            table_rows.append(row)
            base = {**result.identity(), "op": op, "probe": "identify", "seed": seed,
                    "status": entry["status"], "detail": entry.get("error")}
            if entry["status"] != Status.OK:
                row["best model"] = entry.get("error") or entry["status"]
                records.append({**base, "property": "status", "value": None, "evidence": None})
                continue
            fraction = summary["fractions"].get(layer.k(op), 0.0)
            best = summary["best"] if fraction == 1.0 else f"none matches; closest {summary['best']}"
            row.update({"best model": "none: not a direct sum of products" if not_direct(summary) else best,
                        "match": share_text(fraction), "measured": _structure_text(summary["structure"])})
            evidence = f"{layer.label}: {summary['outputs_compared']} outputs; {summary['explanation']}"
            records.append({**base, "property": "best_model", "value": summary["best"], "evidence": evidence})
            records.append({**base, "property": f"match_fraction_k{layer.k(op)}", "value": repr(float(fraction)),
                            "evidence": evidence})
        for item in not_identified:
            reason = f"not identified: {item.reason}"
            per_op[f"{item.name} / {item.kind}"] = {"status": Status.UNSUPPORTED.value, "error": reason, "summary": {},
                                                   "layer": item.to_dict(), "op": NOT_IDENTIFIED}
            table_rows.append({"configuration": result.config.label, "layer": item.name, "op": item.kind, "K": "-",
                               "status": "not identified", "best model": item.reason})
    frame = frame_from_records(records, "probe")
    columns = ["configuration", "layer", "op", "K", "status", "best model", "match", "measured"]
    document = envelope("identify", params, probe_results, seed=seed, device=device, matches=matches)
    notes = ["(match = share of compared outputs bitwise equal to the model's, rounded down (100.0% only when "
             "every output matched), the lower of two input sets: "
             "U[0, 1) operands, and confirmation operands that are signed, spread over exponents, with subnormals, "
             "ties and a cancelling +-M pair in each reduction; measured = crafted-input structure: accumulator, "
             "lanes, partial-sum boundaries)",
             *(n for n in failure_notes(probe_results) if ": note: " in n)]
    if any(layer.name.endswith(TRANSPOSED_SUFFIX) for layer in layers):
        notes.append(f"(a layer marked{TRANSPOSED_SUFFIX} is a Conv2DTranspose, measured as the conv2d it transposes: "
                     f"its forward is the row conv2d_backprop_input, its input gradient the row conv2d, its filter "
                     f"gradient the row conv2d_backprop_filter)")
    unmatched = [(c, k, e["summary"]["explanation"]) for c, per in matches.items() for k, e in per.items()
                 if e["status"] == Status.OK and e["summary"].get("stops_matching_at") is not None]
    notes += [f"{c} {k}: {why}" for c, k, why in unmatched]
    return Outcome(document, table_rows, columns, notes, frame, "probe", probe_results=probe_results)


def _structure_text(structure: dict) -> str:
    if not structure.get("accumulator"):
        return structure.get("note") or "-"
    bounds = structure.get("boundaries") or []
    shown = ", ".join(map(str, bounds[:4])) + (", ..." if len(bounds) > 4 else "")
    order = ", batch innermost" if structure.get("batch_innermost") else ""
    return f"{structure['accumulator']}, lanes {structure['lanes']}, starts [{shown}]{order}"
