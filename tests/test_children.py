"""Children die with their parent (`convprobe.children`), with real processes and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture()
def sleeper(tmp_path):
    """A module that says it runs (after `die_with_parent`, which precedes it), then sleeps."""
    (tmp_path / "sleeper.py").write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}


def test_a_child_dies_when_its_parent_is_sigkilled(sleeper):
    parent_code = textwrap.dedent("""
        import subprocess, sys, time
        from convprobe import children
        child = children.popen("sleeper", [], stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip(), flush=True)  # the child runs, tied to us
        time.sleep(120)
    """)
    with subprocess.Popen([sys.executable, "-c", parent_code], env=sleeper, stdout=subprocess.PIPE,
                          text=True) as parent:
        try:
            child = int(parent.stdout.readline())
            assert alive(child)
            parent.send_signal(signal.SIGKILL)
            parent.wait(timeout=10)
            wait_until(lambda: not alive(child), 5, f"child {child} to die with its parent")
        finally:
            parent.kill()


def test_a_child_whose_parent_died_before_it_started_exits_at_once(sleeper):
    # The pid it should have been started by is not its parent's: that parent is gone.
    env = {**sleeper, "CONVPROBE_PARENT_PID": "1" if os.getpid() != 1 else "2"}
    proc = subprocess.run([sys.executable, "-m", "convprobe.children", "sleeper"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""  # the module never ran


def test_a_child_runs_its_module_with_its_arguments_and_without_the_parent_pid(tmp_path, sleeper):
    (tmp_path / "echo.py").write_text("import json, os, sys\n"
                                      "print(json.dumps([sys.argv[1:], os.environ.get('CONVPROBE_PARENT_PID')]))\n"
                                      "raise SystemExit(3)\n")
    from convprobe import children

    proc = children.run("echo", ["a", "--b"], env=sleeper, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and proc.stdout.strip() == '[["a", "--b"], null]'
