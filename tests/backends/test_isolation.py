"""Process isolation with real child processes and real TensorFlow."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from convprobe.backends.configurations import TensorFlowConfig, resolve_configs
from convprobe.backends.isolation import run_isolated
from convprobe.probes import worker
from convprobe.probes.runner import run_one
from conftest import wait_for

WORKER = worker.__name__

CONV_65519 = textwrap.dedent("""
    import os, numpy as np
    import tensorflow as tf
    x = tf.constant(np.full((1, 1, 4, 1), 65519, np.float16))
    w = tf.constant(np.array([65519, -65519], np.float16).reshape(1, 2, 1, 1))
    tf.nn.conv2d(x, w, 1, "VALID")  # first use: TensorFlow reads and caches its switches
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ["TF_CONV2D_USE_FP16_ACCUMULATE"] = "1"
    print(float(tf.nn.conv2d(x, w, 1, "VALID").numpy().ravel()[0]))
""")


@pytest.mark.tensorflow
def test_a_switch_flipped_after_import_does_not_take_effect_but_a_fresh_child_honours_it():
    # Why isolation exists: in-process, the late setting is ignored (result 0) ...
    late = subprocess.run([sys.executable, "-c", CONV_65519], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    assert late.returncode == 0, late.stderr
    assert late.stdout.strip().splitlines()[-1] == "0.0"
    # ... while a child started with it in its environment accumulates in fp16 (inf).
    config = resolve_configs(backend="tensorflow", accumulate="fp16")[0]
    result = run_one("overflow", config, {"seed": 0})
    assert result.status == "ok" and result.observed["output"] == ["inf", "inf", "inf"]


@pytest.mark.tensorflow
def test_a_parent_setting_does_not_leak_into_a_default_child(monkeypatch):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setenv("TF_CONV2D_USE_FP16_ACCUMULATE", "1")
    config = resolve_configs(backend="tensorflow", accumulate="default")[0]
    result = run_one("overflow", config, {"seed": 0})
    assert result.status == "ok" and result.accumulation == "fp32"
    assert "TF_CONV2D_USE_FP16_ACCUMULATE" not in result.environment


@pytest.fixture()
def probe_dir(tmp_path):
    """A user probe package on disk, importable by children through PYTHONPATH."""
    (tmp_path / "userprobes").mkdir()
    (tmp_path / "userprobes" / "__init__.py").write_text("")
    (tmp_path / "userprobes" / "aborts.py").write_text("import os\ndef run(backend, **_):\n    os.abort()\n")
    (tmp_path / "userprobes" / "sleeps.py").write_text("import time\ndef run(backend, **_):\n    time.sleep(60)\n")
    (tmp_path / "userprobes" / "raises.py").write_text("def run(backend, **_):\n    raise RuntimeError('kernel exploded')\n")
    return str(tmp_path)


def _isolated(probe_dir):
    """A configuration that runs in a child of its own, which finds the user's probes."""
    return TensorFlowConfig(device="cpu", env={"PYTHONPATH": probe_dir})


def test_a_child_that_crashes_becomes_a_crashed_outcome(probe_dir):
    outcome = run_isolated(_isolated(probe_dir), {"probe": "userprobes.aborts", "params": {}}, module=WORKER, timeout=120)
    assert outcome.status == "crashed"
    assert "SIGABRT" in outcome.error


def test_a_child_that_hangs_becomes_a_timeout_outcome(probe_dir):
    outcome = run_isolated(_isolated(probe_dir), {"probe": "userprobes.sleeps", "params": {}}, module=WORKER, timeout=5)
    assert outcome.status == "timeout" and outcome.wall_s < 30


def test_an_exception_in_the_child_becomes_a_failed_outcome(probe_dir):
    outcome = run_isolated(_isolated(probe_dir), {"probe": "userprobes.raises", "params": {}}, module=WORKER, timeout=120)
    assert outcome.status == "failed" and outcome.error == "RuntimeError: kernel exploded"


@pytest.mark.tensorflow
def test_a_gpu_config_without_a_gpu_becomes_an_unsupported_row():
    config = TensorFlowConfig(accumulate="fp16", device="gpu", env={"CUDA_VISIBLE_DEVICES": ""})
    result = run_one("overflow", config, {"seed": 0})
    assert result.status == "unsupported"
    assert "no GPU" in result.error


def _workers_of(parent: int) -> list[int]:
    """The live `convprobe.probes.worker` children of `parent`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == parent and state != "Z" and b"convprobe.probes.worker" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False





@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_worker_dies_with_a_sigkilled_parent_and_leaves_no_temporary_file(probe_dir, tmp_path):
    (tmp_path / "userprobes" / "announces.py").write_text(
        "import os, time\ndef run(backend, **_):\n    open(os.environ['ANNOUNCE'], 'w').close()\n    time.sleep(60)\n")
    temp, announced = tmp_path / "temp", tmp_path / "announced"
    temp.mkdir()
    parent_code = textwrap.dedent(f"""
        from convprobe.backends.configurations import TensorFlowConfig
        from convprobe.backends.isolation import run_isolated
        config = TensorFlowConfig(device="cpu", env={{"PYTHONPATH": {probe_dir!r}}})
        run_isolated(config, {{"probe": "userprobes.announces", "params": {{}}}}, module="convprobe.probes.worker", timeout=120)
    """)
    env = {**os.environ, "TMPDIR": str(temp), "ANNOUNCE": str(announced)}
    with subprocess.Popen([sys.executable, "-c", parent_code], env=env, stdin=subprocess.DEVNULL) as parent:
        try:
            worker, = wait_for(lambda: _workers_of(parent.pid), 60, "the worker to start")
            wait_for(announced.exists, 60, "the worker to run the probe")
            parent.kill()
            parent.wait(timeout=10)
            wait_for(lambda: not _alive(worker), 5, f"worker {worker} to die with its parent")
        finally:
            parent.kill()
    assert list(temp.iterdir()) == []  # the request and the answer travel through pipes


def _loaded_tensorflow(pid: int) -> bool:
    try:
        return "tensorflow" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.tensorflow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_sigkill_to_fingerprint_leaves_no_worker_and_no_temporary_file(tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    with subprocess.Popen([sys.executable, "-m", "convprobe", "fingerprint", "--jobs", "2"], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as parent:
        try:
            workers = wait_for(lambda: [w for w in _workers_of(parent.pid) if _loaded_tensorflow(w)], 120,
                            "a TensorFlow worker")
            parent.kill()
            parent.wait(timeout=10)
            wait_for(lambda: not any(_alive(w) for w in workers), 5, f"workers {workers} to die with fingerprint")
        finally:
            parent.kill()
    assert list(temp.iterdir()) == []
