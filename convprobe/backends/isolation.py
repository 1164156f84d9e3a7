"""Run one backend configuration in a fresh child process.

TensorFlow reads its precision switches once, at import or first use, and caches
them; flipping `os.environ` afterwards changes nothing. So every configuration
runs in its own child (the probe layer's worker module) with its environment set before
TensorFlow is imported. The request goes in on the child's stdin and the JSON
answer comes back on its stdout, which the worker keeps for the answer alone; no
temporary file, so a parent killed mid-sweep leaves nothing behind, and the child
dies with it (`convprobe.children`). A timeout, a crash or a missing answer becomes
a status in the returned record, never an exception that loses a sweep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from convprobe import children
from convprobe.backends.configurations import MANAGED_VARIABLES, FrameworkConfig
from convprobe.options import Status

__all__ = ["IsolatedOutcome", "child_environment", "run_isolated", "STATUSES"]

#: Every status a configuration can end in.
STATUSES = tuple(s.value for s in Status)  # how a run ends: convprobe.options.Status

DEFAULT_TIMEOUT_S = 300.0

#: Quiet TensorFlow's C++ logging in children unless the user chose otherwise.
_QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


@dataclass
class IsolatedOutcome:
    """What came back from a child: its JSON answer, or why there is none."""

    status: str
    payload: dict
    error: str | None
    returncode: int | None
    wall_s: float
    environment: dict[str, str]


def child_environment(config: FrameworkConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the parent's, minus the managed switches, plus the config's.

    Removing managed switches inherited from the user's shell makes 'default'
    mean TensorFlow's default; `--env` settings arrive through `config.env`.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in MANAGED_VARIABLES}
    for key, value in _QUIET.items():
        env.setdefault(key, value)
    env.update(config.env)
    return env


def _tail(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def run_isolated(
    config: FrameworkConfig, task: dict, *, module: str, timeout: float = DEFAULT_TIMEOUT_S
) -> IsolatedOutcome:
    """Run `task` (a JSON-able request on stdin of `python -m MODULE`, which answers on
    stdout) under `config` in a child: the caller names its own worker, so this layer
    knows nothing above it."""
    env = child_environment(config)
    started = time.perf_counter()
    request = json.dumps({"config": config.to_dict(), **task})
    try:
        proc = children.run(module, [], env=env, input=request, capture_output=True, text=True,
                            timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else (expired.stderr or "")
        return IsolatedOutcome(
            "timeout", {}, f"no answer within {timeout:g} s; stderr: {_tail(stderr, 500)}",
            None, time.perf_counter() - started, env,
        )
    wall = time.perf_counter() - started
    try:
        answer = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        return IsolatedOutcome(
            "crashed", {}, f"child {_describe_exit(proc.returncode)} without an answer; stderr: {_tail(proc.stderr)}",
            proc.returncode, wall, env,
        )
    return IsolatedOutcome(answer.get("status", "failed"), answer, answer.get("error"), proc.returncode, wall, env)
