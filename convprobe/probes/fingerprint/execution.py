"""Running the battery through an op (child side): one `reduce_many` for the lot."""

from __future__ import annotations

import numpy as np

from convprobe.errors import InvalidArgument, UnsupportedConfiguration
from convprobe.probes.fingerprint.battery import Group, battery
from convprobe.probes.fingerprint_ops import QUADRATIC_LIMIT, QUADRATIC_OPS, base_op, check_ops, reduce_many

__all__ = ["run", "run_battery", "run_all"]


def run_battery(backend, op: str) -> dict[str, np.ndarray]:
    """Outputs of every group through `op` on `backend`, as float64 arrays.

    Ops whose cost grows as L**2 skip the long groups: their block and chunk
    sizes read "not run".
    """
    calls = _calls(op)
    outputs = reduce_many(backend, op, [(g.a, g.b, g.channel) for g in calls])
    return {g.name: np.asarray(y, dtype=np.float64) for g, y in zip(calls, outputs)}


def _calls(op: str) -> list[Group]:
    return [g for g in battery() if not (op in QUADRATIC_OPS and g.a.shape[1] > QUADRATIC_LIMIT)]


def run_all(backend, ops) -> dict[str, dict[str, np.ndarray]]:
    """`run_battery` for every op in one `reduce_many` (one XLA compilation for the lot)."""
    plan = [(op, g) for op in ops for g in _calls(op)]
    outputs = reduce_many(backend, [op for op, _ in plan], [(g.a, g.b, g.channel) for _, g in plan])
    result: dict[str, dict[str, np.ndarray]] = {op: {} for op in ops}
    for (op, g), y in zip(plan, outputs):
        result[op][g.name] = np.asarray(y, dtype=np.float64)
    return result


def run(backend, *, ops="conv2d", jit_variants=None, **_params) -> dict:
    """Run the battery through each op; JSON-able outputs (repr strings) or why an op failed.

    All ops go through the backend together (one XLA compilation); if that fails,
    each op runs alone so that one failing op cannot hide the others.
    `jit_variants` ([False, True]) runs a TensorFlow backend once per jit
    setting in this same process - configurations whose environments are equal
    differ only by jit_compile, which is per function, not per process - and
    returns {"variants": {"False": ..., "True": ...}}.
    """
    if jit_variants is not None:
        from convprobe.backends.tensorflow import TensorFlowBackend

        if not isinstance(backend, TensorFlowBackend):
            raise InvalidArgument("jit_variants applies to the TensorFlow backend only")
        return {"variants": {
            str(bool(jit)): run(TensorFlowBackend(backend.device, jit_compile=bool(jit)), ops=ops)
            for jit in jit_variants
        }}
    return _run_ops(backend, ops)


def _run_ops(backend, ops) -> dict:
    ops = check_ops(ops)
    together = None
    if len(ops) > 1 and all(base_op(op) in getattr(backend, "capabilities", ()) for op in ops):
        try:
            together = run_all(backend, ops)
        except Exception:  # noqa: BLE001 - fall back to one op at a time, which reports the culprit
            together = None
    results = {}
    for op in ops:
        try:
            outputs = together[op] if together is not None else run_battery(backend, op)
            results[op] = {"status": "ok", "outputs": {k: [repr(float(v)) for v in vals] for k, vals in outputs.items()}}
        except UnsupportedConfiguration as exc:
            results[op] = {"status": "unsupported", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one failing op must not hide the others
            results[op] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"ops": results}
