"""`ProbeResult`: one configuration's answer to one probe, with its evidence.

A result records what was asked (the configuration and its environment), what
was observed, what arithmetic that implies, whether the request was honoured,
and where it was produced (provenance). Its JSON form is the file format;
`to_row` is the flat view used by tables and CSV.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from convprobe.backends.configurations import BackendConfig
from convprobe.provenance import SCHEMA_VERSION

__all__ = ["ProbeResult", "honoured"]


def honoured(requested: str | None, observed: str | None) -> bool | None:
    """Did the backend do what was asked? None when nothing specific was asked."""
    if requested not in ("fp16", "fp32") or observed in (None, "unknown"):
        return None
    return observed == requested


@dataclass
class ProbeResult:
    """One row of evidence: configuration x probe."""

    probe: str
    config: BackendConfig
    status: str
    observed: dict = field(default_factory=dict)
    accumulation: str | None = None
    arithmetic: str | None = None
    verdict: str = ""
    evidence: str = ""
    error: str | None = None
    runtime: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    wall_s: float | None = None
    error_detail: str | None = None  # a failure's traceback: for the JSON, never the terminal

    @property
    def honoured(self) -> bool | None:
        return honoured(self.config.accumulate, self.accumulation)

    def to_record(self) -> dict:
        """The full JSON record (schema-versioned)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "probe": self.probe,
            "config": self.config.to_dict(),
            "status": self.status,
            "requested": self.config.accumulate,
            "accumulation": self.accumulation,
            "arithmetic": self.arithmetic,
            "honoured": self.honoured,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "error": self.error,
            "error_detail": self.error_detail,
            "observed": self.observed,
            "runtime": self.runtime,
            "environment": self.environment,
            "provenance": self.provenance,
            "wall_s": self.wall_s,
        }

    @property
    def device(self) -> str:
        """Where the arithmetic ran: cpu or gpu (the emulator always runs on the CPU)."""
        return self.config.device

    def identity(self) -> dict:
        """The identity columns every table row of this result carries (tables.py's schemas)."""
        config = self.config
        return {
            "backend": config.backend, "configuration": config.label,
            "device": self.device,
            "environment": config.environment or None,
            "provenance": json.dumps(self.provenance, sort_keys=True), "wall_s": self.wall_s,
        }

    def to_row(self, observed_columns: tuple[str, ...] = ()) -> dict:
        """A flat row: configuration, verdict, chosen observations, provenance as JSON."""
        row = {
            "probe": self.probe,
            "configuration": self.config.label,
            "backend": self.config.backend,
            "device": self.device,
            "requested": self.config.accumulate,
            "status": self.status,
            "accumulation": self.accumulation or "",
            "honoured": {True: "yes", False: "NO", None: "-"}[self.honoured],
            "arithmetic": self.arithmetic or "",
        }
        for column in observed_columns:
            row[column] = self.observed.get(column, "")
        row["verdict"] = self.verdict if self.status == "ok" else (self.error or self.status)
        row["environment"] = self.config.environment or "-"
        row["provenance"] = json.dumps(self.provenance, sort_keys=True)
        return row
