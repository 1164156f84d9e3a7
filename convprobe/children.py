"""Child processes that die with their parent, even when the parent is SIGKILLed.

A parent killed by SIGKILL runs no cleanup, so each child arranges its own death:
it is started as ``python -m convprobe.children MODULE ARGS...``, which on Linux
first asks the kernel for SIGKILL when its parent goes (``prctl(PR_SET_PDEATHSIG)``),
then checks that its parent is still the process that started it (the parent may
have died before the request; the child then exits at once), and only then runs
MODULE as ``python -m MODULE ARGS...`` would. The child does this itself rather than
in a ``preexec_fn``, which Python's subprocess documentation calls unsafe in a
parent with threads (`convprobe.probes.runner` starts children from a thread pool).
The kernel sends the signal when the *thread* that started the child ends, so a
child must be started and waited for by the same thread (as `subprocess.run` does).
Elsewhere than Linux there is no such request: children are not tied to their
parent, which still stops them on every path it controls.

Nothing is left on disk either, so there is nothing to sweep after a killed parent:
`convprobe.backends.isolation` passes requests and answers through pipes, and
`convprobe.training.cluster` logs workers to unlinked temporary files.
"""

from __future__ import annotations

import ctypes
import os
import importlib
import importlib.util
import runpy
import signal
import subprocess
import sys

__all__ = ["PARENT_PID", "command", "die_with_parent", "environment", "popen", "run"]

#: The starting parent's pid, in the child's environment (the child removes it).
PARENT_PID = "CONVPROBE_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m MODULE ARGS`` as a child that dies with us."""
    return [sys.executable, "-m", "convprobe.children", module, *args]


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: ours) plus this process's pid, for the child to check its parent against."""
    return {**(os.environ if env is None else env), PARENT_PID: str(os.getpid())}


def run(module: str, args: list[str], *, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` of ``python -m MODULE ARGS`` as a child that dies with this process."""
    return subprocess.run(command(module, *args), env=environment(env), **kwargs)


def popen(module: str, args: list[str], *, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """`subprocess.Popen` of ``python -m MODULE ARGS`` as a child that dies with this process."""
    return subprocess.Popen(command(module, *args), env=environment(env), **kwargs)


def die_with_parent() -> None:
    """Ask for SIGKILL when our parent dies (Linux), then exit now if it already has.

    Does nothing unless `PARENT_PID` is set, i.e. unless `command` started us.
    """
    expected = os.environ.pop(PARENT_PID, None)  # not inherited by our own children
    if expected is None:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if str(os.getppid()) != expected:  # the parent died before the request took effect
        os._exit(1)


def main(argv: list[str]) -> None:
    """``python -m convprobe.children MODULE ARGS...``: tie ourselves to the parent, then be MODULE."""
    die_with_parent()
    if not argv:
        raise SystemExit("usage: python -m convprobe.children MODULE [ARGS...]")
    sys.argv = list(argv)
    spec = importlib.util.find_spec(argv[0])
    if spec is not None and spec.submodule_search_locations is None:
        # A module whose package imports it (the probe worker): run its `main`, once. Run as
        # __main__ it would execute a second time beside the copy its package imported.
        module = importlib.import_module(argv[0])
        if hasattr(module, "main"):
            raise SystemExit(module.main(list(argv[1:])))
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
