"""Shared fixtures for the training harness tests.

The harness writes its XLA flags into os.environ when it imports TensorFlow;
`_keep_environment` undoes that after every test so that tests elsewhere in the
session (and the child processes they start) see the environment they expect.
Tests that need a pristine process (XLA flags, logical devices) run in a
subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _keep_environment(monkeypatch):
    for name in ("XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)


TINY = dict(batch_size=4, resnet_size=8, image_size=8, jit=False)


@pytest.fixture
def tiny():
    """Keyword arguments of the smallest useful run (ResNet-8, 8x8 images, batch 4, no XLA)."""
    return dict(TINY)


@pytest.fixture
def run_python():
    """Run code in a fresh interpreter: `run_python(code, tmp_path)`."""
    return _run_python


def _run_python(code: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (fresh TensorFlow), failing loudly on error."""
    script = tmp_path / "child.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc

