"""Provenance: what every result records about where and how it was produced.

A result without provenance is not a result (DESIGN.md, convention 7). Versions
are read from package metadata, so recording them never imports TensorFlow; a
worker that has imported TensorFlow adds the runtime's own view on top.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from importlib import metadata

from convprobe.random_stream import STREAM_VERSION  # seeded stochastic results depend on it
from convprobe.results import SCHEMA_VERSION  # the envelope's version, recorded in provenance too

__all__ = [
    "SCHEMA_VERSION",
    "PRECISION_ENV_PREFIXES",
    "collect",
    "cpu_caches",
    "cpu_flags",
    "cpu_identity",
    "precision_environment",
    "package_versions",
    "memory_limit",
]


#: Environment variables that change which kernels run or how they round.
PRECISION_ENV_PREFIXES = ("TF_", "XLA_", "ONEDNN_", "DNNL_", "OMP_", "CUDA_", "NVIDIA_", "TF32")

#: CPU features that decide which fp16/bf16 kernels a runtime can pick.
_INTERESTING_CPU_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "asimdhp", "fphp",
)


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages whose behaviour a result depends on."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("convprobe", "numpy", "ml_dtypes", "tensorflow", "keras", "numba", "pandas"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _first_cpu(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo (Linux), or {}."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    if fields:
                        break
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags(path: str = "/proc/cpuinfo") -> list[str]:
    """The precision-relevant CPU flags of this machine (from /proc/cpuinfo on Linux)."""
    fields = _first_cpu(path)
    present = set((fields.get("flags") or fields.get("Features") or "").split())
    return [f for f in _INTERESTING_CPU_FLAGS if f in present]


def cpu_identity(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """Vendor, family, model and stepping numbers: a virtual machine often shows only "AMD
    EPYC" as its model name, and these tell its generation apart (family 25 is Zen 3 and 4,
    family 26 Zen 5)."""
    fields = _first_cpu(path)
    names = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
             "CPU implementer": "implementer", "CPU part": "part", "CPU variant": "variant",
             "CPU revision": "revision"}  # x86, Arm
    return {short: fields[name] for name, short in names.items() if name in fields}


#: Linux's view of the first CPU's caches (from cpuid on x86).
_CACHE_DIRECTORY = "/sys/devices/system/cpu/cpu0/cache"
_CACHE_NAMES = {"Data": "L{}d", "Instruction": "L{}i", "Unified": "L{}"}
_SIZE_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}


def cpu_caches(directory: str = _CACHE_DIRECTORY) -> dict[str, int]:
    """The first CPU's cache sizes in bytes ({"L1d": 49152, "L2": 1048576, ...}), or {} where
    the system does not say. Eigen sizes its GEMM blocks, and so the K chunks identify
    measures, from these (`manage_caching_sizes` in Eigen's GeneralBlockPanelKernel.h):
    two CPUs of one model and flags can split K differently."""
    caches: dict[str, int] = {}
    try:
        entries = sorted(e for e in os.listdir(directory) if e.startswith("index"))
    except OSError:
        return caches
    for entry in entries:
        try:
            level, kind, size = (_read_line(os.path.join(directory, entry, name)) for name in ("level", "type", "size"))
            name = _CACHE_NAMES[kind].format(int(level))
            caches[name] = int(size[:-1]) * _SIZE_UNITS[size[-1]] if size[-1] in _SIZE_UNITS else int(size)
        except (OSError, KeyError, ValueError, IndexError):
            continue  # an entry the system describes otherwise is left out, not guessed
    return caches


def _read_line(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def cpu_model(path: str = "/proc/cpuinfo") -> str:
    """Human-readable CPU model name, or the platform's processor string."""
    return _first_cpu(path).get("model name") or platform.processor() or platform.machine()


#: Variables that share the TF_ prefix but belong to other tools (Terraform).
_NOT_PRECISION_ENV_PREFIXES = ("TF_CLI_", "TF_VAR_", "TF_LOG", "TF_DATA_DIR", "TF_PLUGIN", "TF_IN_AUTOMATION")


def precision_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables (TF_*, XLA_FLAGS, ...) that may change arithmetic."""
    env = os.environ if environ is None else environ
    return {
        k: env[k]
        for k in sorted(env)
        if k.startswith(PRECISION_ENV_PREFIXES) and not k.startswith(_NOT_PRECISION_ENV_PREFIXES)
    }


def collect(
    *,
    seed: int | None = None,
    device: str | None = None,
    environment: dict[str, str] | None = None,
    extra: dict | None = None,
) -> dict:
    """A provenance record: schema, versions, machine, environment, seed, time."""
    record = {
        "schema_version": SCHEMA_VERSION,
        "random_stream": STREAM_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_identity": cpu_identity(),
        "cpu_flags": cpu_flags(),
        "cpu_caches": cpu_caches(),
        "device": device,
        "environment": precision_environment(environment),
        "seed": seed,
        "argv": list(sys.argv),
    }
    if extra:
        record.update(extra)
    return record


def memory_limit() -> int:
    """Bytes a single run may plan to hold: half of this machine's physical memory (the
    bound that size options are checked against before anything is allocated)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
