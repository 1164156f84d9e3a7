"""Child-process entry point: `python -m convprobe.probes.worker`, a JSON request on stdin.

The parent has already put this configuration's precision switches in our
environment, so importing TensorFlow here sees them. We run one probe on one
backend and write one JSON answer on stdout: status, observations, the runtime's
own view of itself, and provenance. Errors become statuses, not tracebacks on the
floor. Pipes rather than files, so that a parent killed mid-run leaves nothing on
disk (`convprobe.children`); the isolation layer starts us through that module.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from convprobe.backends.configurations import BackendConfig, EmulatedConfig, JaxConfig, TensorFlowConfig, TorchConfig
from convprobe.backends.emulated import EmulatedBackend
from convprobe.backends.jax import JaxBackend
from convprobe.backends.pytorch import TorchBackend
from convprobe.errors import UnsupportedConfiguration
from convprobe import provenance
from convprobe.probes.registry import get_probe


def make_backend(config: BackendConfig):
    """The backend object a configuration describes."""
    if isinstance(config, TensorFlowConfig):
        from convprobe.backends.tensorflow import TensorFlowBackend

        return TensorFlowBackend(config.device, jit_compile=config.jit_compile)
    if isinstance(config, JaxConfig):
        return JaxBackend(config.device, **config.options)
    if isinstance(config, TorchConfig):
        return TorchBackend(config.device, **config.options)
    assert isinstance(config, EmulatedConfig)  # (the three kinds `BackendConfig.from_dict` builds)
    return EmulatedBackend(config.model)


def answer(request: dict) -> dict:
    """Run the requested probe and return the JSON-able answer (never raises)."""
    config = BackendConfig.from_dict(request["config"])
    runtime: dict = {}
    detail = None
    try:
        probe = get_probe(request["probe"])
        backend = make_backend(config)
        runtime = backend.runtime_info() if hasattr(backend, "runtime_info") else {}
        observed = probe.run(backend, **request.get("params", {}))
        status, error = "ok", None
    except UnsupportedConfiguration as exc:
        observed, status, error = {}, "unsupported", str(exc)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a result row
        observed, status = {}, "failed"
        error = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]  # the row's one-line reason
        detail = traceback.format_exc()  # the whole story goes to the JSON, not the terminal
    return {
        "status": status,
        "error": error,
        **({"traceback": detail} if status == "failed" else {}),
        "observed": observed,
        "runtime": runtime,
        "provenance": provenance.collect(seed=request.get("params", {}).get("seed"), device=config.device),
    }


def main(argv: list[str]) -> int:
    """Answer the request on stdin on stdout, which carries nothing else: everything
    else written to file descriptor 1 (TensorFlow's C++ logging, a probe's prints) is
    sent to stderr from here on."""
    if argv:
        raise SystemExit("usage: python -m convprobe.probes.worker < REQUEST.json > ANSWER.json")
    answer_stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    result = answer(request)
    with answer_stream:
        json.dump(result, answer_stream)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
