"""Configurations to processes: one child per distinct environment."""

from __future__ import annotations

import dataclasses

from convprobe.backends.configurations import TensorFlowConfig
from convprobe.probes.fingerprint.inference import interpret

__all__ = ["run_grouped"]


def run_grouped(configs, params: dict, *, timeout: float, jobs: int | None = None) -> list:
    """`runner.run_probe('fingerprint', ...)` with one child per distinct environment.

    TensorFlow configurations that differ only in jit_compile share a process
    (one TensorFlow import instead of two); every configuration still gets its
    own `ProbeResult`, in the order given, with a crashed child marking all of
    its configurations.
    """
    from convprobe.probes.runner import annotate, run_many, run_one

    groups: dict[str, list] = {}
    for config in configs:
        shared = dataclasses.replace(config, jit_compile=False) if isinstance(config, TensorFlowConfig) else config
        groups.setdefault(shared.process_key, []).append(config)
    leaders, leader_params = [], []
    for members in groups.values():
        leaders.append(members[0])
        jits = sorted({c.jit_compile for c in members if isinstance(c, TensorFlowConfig)})
        grouped = len(jits) > 1
        leader_params.append({**params, "jit_variants": jits} if grouped else params)
    results_by_leader = dict(enumerate(run_many(
        lambda pair: run_one("fingerprint", pair[0], pair[1], timeout=timeout),
        list(zip(leaders, leader_params)), jobs=jobs, description="fingerprint: processes")))
    out = []
    for config in configs:
        i = next(n for n, members in enumerate(groups.values()) if config in members)
        result = results_by_leader[i]
        observed = result.observed
        if result.status == "ok" and "variants" in observed:
            observed = observed["variants"][str(bool(getattr(config, "jit_compile", False)))]
        copy = dataclasses.replace(result, config=config, observed=observed)
        if copy.status == "ok":
            annotate(copy, interpret(observed))
        out.append(copy)
    return out
