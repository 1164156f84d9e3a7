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

from convprobe.backends.configurations import BackendConfig, matrix_configs, resolve_configs
from convprobe.backends.jax import jax_installed
from convprobe.backends.pytorch import torch_installed
from convprobe.options import Status
from convprobe.probes.fingerprint import findings_observed, run_grouped
from convprobe.probes.fingerprint.properties import Accumulation
from convprobe.probes.result import ProbeResult
from convprobe.probes.studies import Outcome, envelope, failure_notes

__all__ = ["Verdict", "ContractCell", "FRAMEWORKS", "ROWS", "contract_configs", "contract_cells", "run_contract",
           "COLUMNS"]

#: The frameworks a contract covers (the emulator declares nothing: it is the reference).
FRAMEWORKS = ("tensorflow", "jax", "torch")
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
    present = {"tensorflow": lambda: True, "jax": jax_installed, "torch": torch_installed}
    return tuple(name for name in frameworks if present[name]())


def contract_configs(frameworks: tuple[str, ...], device: str, rows: str) -> list[BackendConfig]:
    """Each framework's configurations: its `--accumulate` requests, its matrix rows, or both."""
    out: list[BackendConfig] = []
    for framework in frameworks:
        if rows in ("requests", "all"):
            out += resolve_configs(backend=framework, accumulate="all", device=device)
        if rows in ("matrix", "all"):
            out += matrix_configs(device, "all", framework)
    return out


def _verdict(declared: str | None, accumulation: Accumulation) -> Verdict:
    if declared not in ("fp16", "fp32"):
        return Verdict.NOTHING_DECLARED
    return Verdict.HONOURED if accumulation.format == declared else Verdict.NOT_HONOURED


def contract_cells(result: ProbeResult, ops) -> list[ContractCell]:
    """The cells of one configuration's fingerprint result, one per op."""
    config = result.config
    declared = config.accumulate if config.accumulate in ("fp16", "fp32") else None
    findings = findings_observed(result.observed) if result.status == Status.OK else {}
    cells = []
    for op in ops:
        found = findings.get(op)
        base = {"framework": config.backend, "configuration": config.label, "switches": config.environment or "-",
                "op": op, "declared": declared}
        if found is None:
            cells.append(ContractCell(**base, observed=None, verdict=Verdict.NOT_MEASURED,
                                      evidence=result.error or f"{op} did not run"))
            continue
        accumulation = found["accumulation"]
        cells.append(ContractCell(**base, observed=accumulation.shown, verdict=_verdict(declared, accumulation.value),
                                  evidence=accumulation.evidence))
    return cells


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
    summary = (f"{len(broken)} of {sum(c.declared is not None for c in cells)} declared (configuration, op) cells "
               f"not honoured")
    document = envelope("contract", params, probe_results, seed=seed, device=device,
                         cells=[cell.to_dict() for cell in cells])
    return Outcome(document, rows, COLUMNS, notes, csv_rows=[cell.to_dict() for cell in cells],
                   probe_results=probe_results, summary=summary)
