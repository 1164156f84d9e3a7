"""The precision contract: for each framework, configuration and op, the accumulation its
switches declare against the accumulation the fingerprint battery observes there.

A configuration declares fp16 or fp32 accumulation (`BackendConfig.accumulate`: what the
request or the matrix row asks for) or nothing (a default). The battery runs through the
op in that configuration's own process, and its typed `accumulation` finding (the partial
sums' significand bits, lanes, product rounding) is compared with the declaration. A
declaration the op does not keep is a finding, shown as *not honoured*, with the evidence.

The reading is the battery's, at its own crafted shapes: the accumulator the partial sums
are kept in there. How a kernel rounds between its blocks or taps at a user's layer (a
per-tap fp16 store, say) is identify's to say, at that layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

from convprobe.backends.configurations import (MATRIX_BACKENDS, BackendConfig, framework_installed, matrix_configs,
                                               resolve_configs)
from convprobe.options import Status
from convprobe.probes.fingerprint import findings_observed, run_grouped
from convprobe.probes.fingerprint.properties import Accumulation
from convprobe.probes.result import ProbeResult, honoured
from convprobe.probes.studies import Outcome, envelope, failure_notes

__all__ = ["Verdict", "ContractCell", "FRAMEWORKS", "ROWS", "contract_configs", "contract_cells", "run_contract",
           "contract_summary", "contract_markdown", "COLUMNS"]

#: The frameworks a contract covers (the emulator declares nothing: it is the reference).
FRAMEWORKS = MATRIX_BACKENDS
#: Which configurations are asked: the `--accumulate` requests, the matrix rows, or both.
ROWS = ("requests", "matrix", "all")
COLUMNS = ["framework", "configuration", "switches", "op", "declared", "observed", "verdict"]


class Verdict(StrEnum):
    HONOURED = "honoured"
    NOT_HONOURED = "NOT HONOURED"
    NOTHING_DECLARED = "nothing declared"
    NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class ContractCell:
    """One (configuration, op): what was declared, what was observed, and the verdict with its evidence."""

    framework: str
    configuration: str
    switches: str
    op: str
    declared: str | None
    observed: str | None
    verdict: Verdict
    evidence: str

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": str(self.verdict)}


def installed(frameworks: tuple[str, ...] = FRAMEWORKS) -> tuple[str, ...]:
    """The frameworks of `frameworks` that can run here."""
    return tuple(name for name in frameworks if framework_installed(name))


def contract_configs(frameworks: tuple[str, ...], device: str, rows: str) -> list[BackendConfig]:
    """Each framework's configurations: its `--accumulate` requests, its matrix rows, or both
    (each label once: a request and a matrix row of one name are one configuration)."""
    out: dict[str, BackendConfig] = {}
    for framework in frameworks:
        found = [*(resolve_configs(backend=framework, accumulate="all", device=device)
                   if rows in ("requests", "all") else []),
                 *(matrix_configs(device, "all", framework) if rows in ("matrix", "all") else [])]
        for config in found:
            out.setdefault(config.label, config)
    return list(out.values())


def _verdict(declared: str | None, accumulation: Accumulation) -> Verdict:
    """`result.honoured`'s answer (the rule every command's 'honoured' column uses), as a verdict."""
    kept = honoured(declared, accumulation.format)
    return Verdict.NOTHING_DECLARED if kept is None else Verdict.HONOURED if kept else Verdict.NOT_HONOURED


def contract_cells(result: ProbeResult, ops) -> list[ContractCell]:
    """The cells of one configuration's fingerprint result, one per op."""
    config = result.config
    declared = config.accumulate if config.accumulate in ("fp16", "fp32") else None
    findings = findings_observed(result.observed) if result.status == Status.OK else {}
    per_op = result.observed.get("ops", {}) if result.status == Status.OK else {}
    cells = []
    for op in ops:
        found = findings.get(op)
        base = {"framework": config.backend, "configuration": config.label, "switches": config.environment or "-",
                "op": op, "declared": declared}
        if found is None:  # the process failed, or it ran and this op did not
            reason = result.error or per_op.get(op, {}).get("error") or f"{op} did not run"
            cells.append(ContractCell(**base, observed=None, verdict=Verdict.NOT_MEASURED, evidence=reason))
            continue
        accumulation = found["accumulation"]
        cells.append(ContractCell(**base, observed=accumulation.shown, verdict=_verdict(declared, accumulation.value),
                                  evidence=accumulation.evidence))
    return cells


def contract_summary(cells) -> str:
    """'N of M declared (configuration, op) cells not honoured', and the declared cells that
    could not be measured, apart (cells as `ContractCell.to_dict`s or cells)."""
    cells = [c if isinstance(c, dict) else c.to_dict() for c in cells]
    declared = [c for c in cells if c["declared"]]
    broken = sum(c["verdict"] == Verdict.NOT_HONOURED for c in declared)
    unmeasured = sum(c["verdict"] == Verdict.NOT_MEASURED for c in declared)
    return (f"{broken} of {len(declared) - unmeasured} declared (configuration, op) cells not honoured"
            + (f"; {unmeasured} declared cells not measured" if unmeasured else ""))


def contract_markdown(cells) -> list[str]:
    """The cells as a Markdown table (a declaration not kept in bold), for the generated pages."""
    return ["| framework | configuration | switches | op | declared | observed | verdict |",
            "|---|---|---|---|---|---|---|",
            *(f"| {c['framework']} | {c['configuration']} | {c['switches']} | {c['op']} | {c['declared'] or '-'} | "
              f"{c['observed'] or '-'} | {'**NOT HONOURED**' if c['verdict'] == Verdict.NOT_HONOURED else c['verdict']} |"
              for c in cells)]


def run_contract(configs: list[BackendConfig], ops, *, seed: int, device: str, timeout: float,
                 jobs: int | None) -> Outcome:
    """The battery through every op in every configuration, each in its own process, and the
    contract cells; a declaration an op does not keep is listed under the table."""
    params = {"ops": list(ops), "seed": seed}
    probe_results = run_grouped(configs, params, timeout=timeout, jobs=jobs)
    cells = [cell for result in probe_results for cell in contract_cells(result, ops)]
    rows = [{key: "-" if value is None else value for key, value in cell.to_dict().items() if key in COLUMNS}
            for cell in cells]
    broken = [cell for cell in cells if cell.verdict is Verdict.NOT_HONOURED]
    notes = [f"{cell.configuration} {cell.op}: declared {cell.declared}, observed {cell.observed} ({cell.evidence})"
             for cell in broken] + failure_notes(probe_results)
    summary = contract_summary(cells)
    document = envelope("contract", params, probe_results, seed=seed, device=device,
                         cells=[cell.to_dict() for cell in cells])
    return Outcome(document, rows, COLUMNS, notes, csv_rows=[cell.to_dict() for cell in cells],
                   probe_results=probe_results, summary=summary)
