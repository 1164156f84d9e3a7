"""Run one probe across many backend configurations, in parallel, losing nothing.

TensorFlow configurations each run in their own child process (see
`convprobe.backends.isolation`); emulated ones run in this process, since the
emulator has no cached global state. Children run concurrently, up to the
number of cores, because each spends most of its time importing TensorFlow.
Every configuration yields exactly one `ProbeResult`, whatever happened to it.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from convprobe import provenance
from convprobe.backends.configurations import BackendConfig
from convprobe.backends.isolation import DEFAULT_TIMEOUT_S, run_isolated
from convprobe.probes.registry import get_probe
from convprobe.probes.result import ProbeResult

__all__ = ["run_probe", "run_one"]


def run_one(probe: str, config: BackendConfig, params: dict, *, timeout: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    """One probe on one configuration -> one result row (never raises for backend failures)."""
    task = {"probe": probe, "params": params}
    started = time.perf_counter()
    if config.backend == "tensorflow":
        outcome = run_isolated(config, task, timeout=timeout)
        status, payload, error, environment = outcome.status, outcome.payload, outcome.error, outcome.environment
        wall = outcome.wall_s
    else:
        from convprobe.worker import answer

        payload = answer({"config": config.to_dict(), **task})
        status, error = payload["status"], payload.get("error")
        environment = provenance.precision_environment()
        wall = time.perf_counter() - started
    result = ProbeResult(
        probe=probe, config=config, status=status, observed=payload.get("observed", {}),
        error=error, runtime=payload.get("runtime", {}),
        environment=provenance.precision_environment(environment),
        provenance=payload.get("provenance") or provenance.collect(seed=params.get("seed"), device=config.device),
        wall_s=round(wall, 3), error_detail=payload.get("traceback"),
    )
    if status == "ok":
        inferred = get_probe(probe).interpret(result.observed)
        result.accumulation = inferred["accumulation"]
        result.arithmetic = inferred["arithmetic"]
        result.verdict = inferred["verdict"]
        result.evidence = inferred["evidence"]
        if result.honoured is False:
            result.verdict += f" (requested {config.accumulate}, observed {result.accumulation}: the request was ignored)"
    return result


def run_probe(
    probe: str,
    configs: list[BackendConfig],
    params: dict | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    jobs: int | None = None,
) -> list[ProbeResult]:
    """Run `probe` on every configuration; results come back in the configs' order."""
    get_probe(probe)  # validate the name before starting anything
    params = dict(params or {})
    workers = max(1, min(len(configs), jobs or os.cpu_count() or 1))
    if workers == 1:
        return [run_one(probe, c, params, timeout=timeout) for c in configs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda c: run_one(probe, c, params, timeout=timeout), configs))
