"""From the battery's outputs to properties (parent side), and the one-line verdict.

`infer_findings` runs each property of `properties` in dependency order, handing on
typed values; `infer` renders them as the table's strings with their evidence.
"""

from __future__ import annotations

import numpy as np

from convprobe.probes.fingerprint import properties as prop
from convprobe.probes.fingerprint.battery import PROPERTIES, battery

__all__ = ["infer", "infer_findings", "observations", "infer_observed", "findings_observed", "interpret", "fingerprint_backend"]


def observations(outputs: dict[str, np.ndarray]) -> prop.Observations:
    """The battery's outputs keyed by each row's metadata."""
    values: dict[tuple, float] = {}
    for group in battery():
        if group.name in outputs:
            for meta, v in zip(group.rows, outputs[group.name]):
                values[tuple(sorted(meta.items()))] = float(v)
    return prop.Observations(values)


def infer_findings(outputs: dict[str, np.ndarray]) -> dict[str, prop.Finding]:
    """Outputs of `run_battery` -> {property: Finding}, in table order."""
    get = observations(outputs)
    lane_finding = prop.lanes(get)
    lanes = lane_finding.value
    bits = prop.accumulator_bits(get, lanes)
    products = prop.product_bits(get)
    mode = prop.rounding(get, bits.value)
    pov = prop.product_overflow(get)
    found: dict[str, prop.Finding] = {
        "accumulation": prop.accumulation(bits.value, products.value, lanes, lane_finding.evidence),
        "accumulator_bits": bits,
        "extra_bits": prop.extra_bits(bits.value),
        "rounding": mode,
        "double_rounding": prop.double_rounding(get, bits.value, products.value, mode.value),
        "product_bits": products,
        "subnormal_inputs": prop.subnormal_inputs(get),
        "subnormal_results": prop.subnormal_results(get),
        "overflow": prop.overflow(get),
        "accumulator_range": prop.accumulator_range(get),
        "product_overflow": pov,
        "block_size": prop.block_size(get, bits.value, pov.value, lanes),
        "chunk_size": prop.chunk_size(get, bits.value),
    }
    return {name: found[name] for name in PROPERTIES}


def infer(outputs: dict[str, np.ndarray]) -> dict[str, dict[str, str]]:
    """Outputs of `run_battery` -> {property: {"value": shown, "evidence": str}}."""
    return {name: {"value": f.shown, "evidence": f.evidence} for name, f in infer_findings(outputs).items()}


def _decode(op_result: dict) -> dict[str, np.ndarray]:
    return {k: np.array([float(v) for v in vals]) for k, vals in op_result["outputs"].items()}


def infer_observed(observed: dict) -> dict[str, dict]:
    """{op: {"status", "error", "properties"}} from `run`'s observations."""
    per_op = {}
    for op, result in observed.get("ops", {}).items():
        if result.get("status") == "ok":
            per_op[op] = {"status": "ok", "error": None, "properties": infer(_decode(result))}
        else:
            per_op[op] = {"status": result.get("status", "failed"), "error": result.get("error"), "properties": {}}
    return per_op


def findings_observed(observed: dict) -> dict[str, dict[str, prop.Finding] | None]:
    """{op: its typed findings (None for an op that did not run)} from `run`'s observations."""
    return {op: infer_findings(_decode(result)) if result.get("status") == "ok" else None
            for op, result in observed.get("ops", {}).items()}


def _verdict(acc: prop.Accumulation) -> str:
    """One plain accumulator's format; anything else (rounded products, lanes) is its own
    answer, so that ops compare as they are shown."""
    return acc.shown() if acc.products is not None or acc.lanes is not None else acc.format


def interpret(observed: dict) -> dict:
    """The runner's one-line view: accumulation per op; details stay in `infer_observed`."""
    if "variants" in observed:
        return {"accumulation": "unknown", "arithmetic": "", "verdict": "several jit variants (see run_grouped)",
                "evidence": ""}
    shown: dict[str, str] = {}
    verdicts: set[str] = set()
    evidence: list[str] = []
    for op, result in observed.get("ops", {}).items():
        if result.get("status") != "ok":
            shown[op] = result.get("status", "failed")
            verdicts.add(shown[op])
            continue
        found = infer_findings(_decode(result))
        shown[op] = found["accumulation"].shown
        verdicts.add(_verdict(found["accumulation"].value))
        evidence.append(f"{op}: {found['accumulator_bits'].evidence}")
    single = verdicts.pop() if len(verdicts) == 1 else None
    if single == "exact/wide":
        single = "fp32"  # fp16 inputs cannot show more than fp32
    summary = ", ".join(f"{op} {a}" for op, a in shown.items())
    return {
        "accumulation": single if single in ("fp16", "fp32", "bf16") else ("mixed" if len(shown) > 1 else "unknown"),
        "arithmetic": summary,
        "verdict": summary,
        "evidence": "; ".join(evidence),
    }


def fingerprint_backend(backend, op: str = "matmul") -> dict[str, str]:
    """In-process fingerprint of one op: {property: value} (the self-check's entry point)."""
    from convprobe.probes.fingerprint.execution import run_battery

    return {k: v["value"] for k, v in infer(run_battery(backend, op)).items()}
