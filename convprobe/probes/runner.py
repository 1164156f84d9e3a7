"""Run one probe across many backend configurations, in parallel, losing nothing.

TensorFlow and JAX configurations each run in their own child process (see
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
from convprobe.backends.configurations import BackendConfig, FrameworkConfig
from convprobe.backends.isolation import DEFAULT_TIMEOUT_S, run_isolated
from convprobe.probes import worker
from convprobe.probes.registry import get_probe
from convprobe.probes.result import ProbeResult
from convprobe.progress import tracker

__all__ = ["run_probe", "run_one", "run_many", "annotate"]


def run_one(probe: str, config: BackendConfig, params: dict, *, timeout: float = DEFAULT_TIMEOUT_S,
            name: str | None = None) -> ProbeResult:
    """One probe on one configuration -> one result row (never raises for backend failures);
    `name` is the probe's name in the row (default `probe`)."""
    task = {"probe": probe, "params": params}
    started = time.perf_counter()
    if config.isolated:
        assert isinstance(config, FrameworkConfig)  # (the configurations that run isolated)
        outcome = run_isolated(config, task, module=worker.__name__, timeout=timeout)
        status, payload, error, environment = outcome.status, outcome.payload, outcome.error, outcome.environment
        wall = outcome.wall_s
    else:
        payload = worker.answer({"config": config.to_dict(), **task})
        status, error = payload["status"], payload.get("error")
        environment = provenance.precision_environment()
        wall = time.perf_counter() - started
    result = ProbeResult(
        probe=name or probe, config=config, status=status, observed=payload.get("observed", {}),
        error=error, runtime=payload.get("runtime", {}),
        environment=provenance.precision_environment(environment),
        provenance=payload.get("provenance") or provenance.collect(seed=params.get("seed"), device=config.device),
        wall_s=round(wall, 3), error_detail=payload.get("traceback"),
    )
    if status == "ok":
        annotate(result, get_probe(probe).interpret(result.observed))
    return result


def annotate(result: ProbeResult, inferred: dict) -> ProbeResult:
    """Set a result's accumulation, arithmetic, verdict and evidence from its probe's
    interpretation; the verdict also says when the request was ignored and when the
    configuration's GPU-only switches cannot act (a CPU)."""
    config = result.config
    result.accumulation = inferred["accumulation"]
    result.arithmetic = inferred["arithmetic"]
    result.verdict = inferred["verdict"]
    result.evidence = inferred["evidence"]
    if result.honoured is False:
        result.verdict += f" (requested {config.accumulate}, observed {result.accumulation}: the request was ignored)"
    if config.warnings:
        switches = [w.split(" ", 1)[0] for w in config.warnings]
        verb = "acts" if len(switches) == 1 else "act"
        result.verdict = f"no effect: {', '.join(switches)} {verb} only on a GPU; {result.verdict}"
    return result


def run_probe(
    probe: str,
    configs: list[BackendConfig],
    params: dict | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    jobs: int | None = None,
    name: str | None = None,
) -> list[ProbeResult]:
    """Run `probe` (a registered name or a dotted module path) on every configuration; results
    come back in the configs' order, named `name` (default `probe`)."""
    get_probe(probe)  # validate the name before starting anything
    params = dict(params or {})
    return run_many(lambda c: run_one(probe, c, params, timeout=timeout, name=name), configs, jobs=jobs,
                    description=f"{name or probe}: configurations")


def run_many(work, items: list, *, jobs: int | None, description: str) -> list:
    """`work(item)` for every item, `jobs` at a time (default: one per core), results in the
    items' order, with progress on a terminal (`convprobe.progress`)."""
    workers = max(1, min(len(items), jobs or os.cpu_count() or 1))
    with tracker(len(items), description) as advance:
        def tracked(item):
            result = work(item)
            advance(getattr(getattr(result, "config", None), "label", ""))
            return result

        if workers == 1:
            return [tracked(item) for item in items]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(tracked, items))
