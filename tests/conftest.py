"""Shared test helpers: run the real `convprobe` CLI in a child process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from convprobe import cli
from convprobe.backends import EmulatedBackend
from convprobe.errors import UnsupportedConfiguration

REPO = Path(__file__).resolve().parents[1]


#: The environment the tests were started in: in-process tests may set switches of their own
#: (the training harness adds XLA_FLAGS before it imports TensorFlow), which a user's shell
#: would not have; with several test files per worker they would leak into later CLI runs.
_SHELL_ENV = dict(os.environ)


def main_in_process(argv: list[str]) -> tuple[int, str, str]:
    """`convprobe.cli.main(argv)` in this process: (exit code, stdout, stderr); argparse's own
    errors (SystemExit) give their code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def wait_for(condition, timeout: float, what: str, poll: float = 0.05):
    """`condition()`'s first truthy value, polled until `timeout` seconds have passed; an
    AssertionError naming `what` after that."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)
    return found


def run_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m convprobe ARGS` as a user would run it; returns the completed process."""
    full_env = {**_SHELL_ENV, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "convprobe", *args], capture_output=True, text=True,
        env=full_env, timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL,
    )


def run_cli_json(*args: str, **kwargs) -> dict:
    proc = run_cli(*args, "--format", "json", **kwargs)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def rows_by_label(document: dict) -> dict[str, dict]:
    return {r["config"]["label"]: r for r in document["results"]}


@pytest.fixture(scope="session")
def overflow_all() -> dict:
    """`convprobe overflow --accumulate all --backend all` on the CPU, run once."""
    return run_cli_json("overflow", "--accumulate", "all", "--backend", "all", "--device", "cpu")


@pytest.fixture(scope="session")
def compare_all() -> dict:
    """`convprobe compare --accumulate all --backend all` with the question's shapes, run once."""
    return run_cli_json("compare", "--accumulate", "all", "--backend", "all", "--seed", "0")


def assert_conv_ops_match_exact(backend, padding, strides, dilation, refused=lambda exc: False) -> None:
    """A backend's conv2d and both gradients against the exact emulator on small integers, whose
    products and sums are exact in fp32: a difference is a convention (padding, strides,
    dilation, gradient shapes), not rounding. `refused(exc)`: whether an UnsupportedConfiguration
    is the backend's known refusal of this case."""
    rng = np.random.default_rng(11)
    x = rng.integers(-3, 4, (2, 9, 8, 3)).astype(np.float32)
    w = rng.integers(-3, 4, (3, 2, 3, 4)).astype(np.float32)
    exact = EmulatedBackend("exact:fp64")
    kwargs = {"strides": strides, "padding": padding, "dilation": dilation}
    y = backend.conv2d(x, w, **kwargs)
    np.testing.assert_array_equal(y, exact.conv2d(x.astype(np.float64), w.astype(np.float64), **kwargs))
    dy = rng.integers(-3, 4, y.shape).astype(np.float32)
    for got, want in (
        (lambda: backend.conv2d_backprop_input(dy, w, x.shape, **kwargs),
         exact.conv2d_backprop_input(dy.astype(np.float64), w.astype(np.float64), x.shape, **kwargs)),
        (lambda: backend.conv2d_backprop_filter(x, dy, w.shape, **kwargs),
         exact.conv2d_backprop_filter(x.astype(np.float64), dy.astype(np.float64), w.shape, **kwargs)),
    ):
        try:
            np.testing.assert_array_equal(got(), want)
        except UnsupportedConfiguration as exc:
            assert refused(exc), exc

