"""Shared fixtures for the training harness tests.

The faithful-fp16 XLA flags go into the environment here, before any test in
this directory imports TensorFlow (the harness would do the same). Tests that
need a pristine process (XLA flags, logical devices) run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convprobe.training import runtime

runtime.ensure_xla_flags()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
