"""pytest plugin: a report header with what numerical results depend on.

Loaded automatically (entry point `pytest11`) wherever convprobe is installed;
it adds no fixtures or behaviour unless a test asks for them.
"""

from __future__ import annotations


def pytest_report_header(config) -> list[str]:
    from convprobe import provenance

    versions = provenance.package_versions()
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    flags = " ".join(provenance.cpu_flags()) or "none reported"
    return [f"convprobe: {shown}", f"convprobe: cpu {provenance.cpu_model()}; flags {flags}"]
