"""Name -> probe module. A probe module has `run(backend, **params) -> dict`.

`run` executes where the backend lives (a child process for TensorFlow) and
returns JSON-able observations only; interpretation happens in the parent. A
dotted module path ("mypackage.myprobe") names a user-supplied probe.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from convprobe.errors import invalid_choice

__all__ = ["PROBES", "get_probe"]

PROBES = {
    "overflow": "convprobe.probes.overflow",
    "compare": "convprobe.probes.compare",
    "fingerprint": "convprobe.probes.fingerprint",
    "sweep": "convprobe.probes.sweep",
}


def get_probe(name: str) -> ModuleType:
    """The probe module called `name` (a registered name or a dotted module path)."""
    if name in PROBES:
        return importlib.import_module(PROBES[name])
    if "." in name:
        module = importlib.import_module(name)
        if callable(getattr(module, "run", None)):
            return module
    raise invalid_choice("probe", name, sorted(PROBES))
