"""Probes: crafted inputs run on a backend configuration, and what they reveal.

Each probe module has `run(backend, **params) -> dict` (executed where the
backend lives, possibly a child process) and `interpret(observed) -> dict`
(accumulation, arithmetic, verdict, evidence).
"""

from convprobe.probes.registry import PROBES, get_probe
from convprobe.probes.result import ProbeResult
from convprobe.probes.runner import run_one, run_probe

__all__ = ["PROBES", "get_probe", "ProbeResult", "run_one", "run_probe"]
