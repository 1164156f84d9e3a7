"""`--distribute multi-worker` (MultiWorkerMirroredStrategy) rehearsed with 2 local workers.

Two workers of batch 8 each are the same arithmetic as one process mirrored over 2 logical
devices, and the records are equal to the bit. One undistributed process with the same global
batch differs, for one reason: batch normalisation normalises each replica's 8 images with
their own statistics; its step-0 loss, recomputed per half of the batch, is the workers' one.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convprobe.formats import FP32
from convprobe.training.cluster import local_tf_configs
from conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--steps", "4", "--record-every", "2", "--resnet-size", "8", "--image-size", "8", "--batch-size", "16"]
FAST = [*ARGS, "--no-jit"]  # XLA compiles each process's steps for about a minute: the slow test has it
TIMING = {"step_seconds", "images_per_second"}


def _train(*argv: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "convprobe", "train", *argv], capture_output=True, text=True,
                          cwd=REPO, stdin=subprocess.DEVNULL, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(handle)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("mw")
    workers = _train(*FAST, "--distribute", "multi-worker", "--local-workers", "2", "--output", str(out / "mw"))
    _train(*FAST, "--distribute", "mirrored", "--devices", "2", "--output", str(out / "mirrored"))
    return out, workers


def test_two_local_workers_record_what_one_mirrored_process_records(runs):
    out, _ = runs
    steps = _rows(out / "mw" / "steps.csv")
    assert [r["step"] for r in steps] == ["0", "1", "2", "3"]
    assert steps == _rows(out / "mirrored" / "steps.csv")
    assert _rows(out / "mw" / "telemetry.csv") == _rows(out / "mirrored" / "telemetry.csv")
    header = json.loads((out / "mw" / "header.json").read_text())
    runtime = header["provenance"]["runtime"]
    assert runtime["replicas"] == 2 and len(runtime["cluster"]) == 2 and runtime["jit_effective"] is False  # --no-jit
    assert json.loads((out / "mw" / "summary.json").read_text())["summary"]["final_step"] == 4


def test_one_process_differs_only_by_per_replica_batch_statistics(runs, tmp_path):
    out, _ = runs
    code = (
        "import json, sys, numpy as np, keras\n"
        "from convprobe.training.config import validate_config\n"
        "from convprobe.training.trainer import Trainer\n"
        "config = validate_config(steps=4, record_every=2, resnet_size=8, image_size=8, batch_size=16, jit=False)\n"
        "t = Trainer(config, eager=True)\n"
        "images, labels = t.data.batch(0, 16)\n"
        "def ce(x, y):\n"
        "    logits = t.model(x, training=True)[0]\n"
        "    return float(np.sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))\n"
        "print(json.dumps({'whole': ce(images, labels) / 16,\n"
        "                  'halves': (ce(images[:8], labels[:8]) + ce(images[8:], labels[8:])) / 16}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = json.loads(proc.stdout.strip().splitlines()[-1])
    workers = float(_rows(out / "mw" / "steps.csv")[0]["loss"])
    # The same arithmetic per replica, summed in another order: 16 positive fp32 terms, so the
    # two sums differ by at most twice gamma_16 (Higham, Thm 3.1) relative to the loss.
    tolerance = 2 * 16 * FP32.unit_roundoff
    assert losses["halves"] == pytest.approx(workers, rel=tolerance)
    assert abs(losses["whole"] - workers) > 1e-4  # one batch of 16 normalises differently


@pytest.mark.slow
def test_an_interrupted_cluster_run_resumes_to_the_same_records(runs, tmp_path):
    out, _ = runs
    run = str(tmp_path / "resumed")
    common = ["--record-every", "2", "--resnet-size", "8", "--image-size", "8", "--batch-size", "16", "--no-jit",
              "--distribute", "multi-worker", "--local-workers", "2", "--output", run, "--checkpoint-every", "2"]
    _train("--steps", "2", *common)
    _train("--steps", "4", *common)
    assert _rows(Path(run) / "steps.csv") == _rows(out / "mw" / "steps.csv")
    assert json.loads((Path(run) / "header.json").read_text())["resumed_at_steps"] == [2]


@pytest.mark.slow
def test_xla_compiles_each_replica_under_both_strategies_alike(tmp_path):
    _train(*ARGS, "--distribute", "multi-worker", "--local-workers", "2", "--output", str(tmp_path / "mw"))
    _train(*ARGS, "--distribute", "mirrored", "--devices", "2", "--output", str(tmp_path / "mirrored"))
    assert _rows(tmp_path / "mw" / "steps.csv") == _rows(tmp_path / "mirrored" / "steps.csv")
    assert _rows(tmp_path / "mw" / "telemetry.csv") == _rows(tmp_path / "mirrored" / "telemetry.csv")
    runtime = json.loads((tmp_path / "mw" / "header.json").read_text())["provenance"]["runtime"]
    assert runtime["jit_effective"] is True and "each replica's forward and backward pass" in runtime["jit_scope"]


def _children(parent: int) -> list[int]:
    """The live children of `parent`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == parent and state != "Z":
            found.append(int(entry.name))
    return found


def _handles_sigterm(pid: int) -> bool:
    """Whether `pid` has a SIGTERM handler: in a worker, TensorFlow's preemption notifier, which
    the strategy installs just before it waits for its peers."""
    try:
        caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)




@pytest.mark.tensorflow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_waiting_for_an_unreachable_peer_stops_on_a_signal(tmp_path, signum):
    # This machine is worker 0 of 2; worker 1's port has no one behind it.
    env = {**os.environ, "TF_CONFIG": local_tf_configs(2)[0]}
    argv = ["--distribute", "multi-worker", "--steps", "2", "--resnet-size", "8", "--image-size", "8",
            "--batch-size", "8", "--no-jit", "--output", str(tmp_path / "run")]
    code = f"import sys; from convprobe.training.cluster import run_worker; sys.exit(run_worker({argv!r}))"
    with subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            worker, = wait_for(lambda: _children(proc.pid), 60, "the worker to start")
            wait_for(lambda: _handles_sigterm(worker), 120, "TensorFlow to wait for the peers")
            time.sleep(1)
            proc.send_signal(signum)
            # a stop that waited for the peer instead would run past this hang guard (TimeoutExpired);
            # the exit code and the message below say the signal stopped it, without timing it
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signum, err[-2000:]
    name = signal.Signals(signum).name
    assert err.strip().splitlines()[-1] == f"convprobe train: stopped by {name}; worker 0 was stopped"
    assert err.count("convprobe train:") == 1 and "Traceback" not in err
    assert not Path(f"/proc/{worker}").exists()  # stopped and reaped


@pytest.mark.tensorflow
def test_local_workers_stop_together_on_sigterm(tmp_path):
    argv = ["--steps", "1000", "--resnet-size", "8", "--image-size", "8", "--batch-size", "16", "--no-jit",
            "--distribute", "multi-worker", "--output", str(tmp_path / "run")]
    code = f"import sys; from convprobe.training.cluster import run_local_workers; " \
           f"sys.exit(run_local_workers({argv!r}, 2))"
    with subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        try:
            workers = wait_for(lambda: len(found := _children(proc.pid)) == 2 and found, 60, "the 2 workers")
            wait_for(lambda: all(_handles_sigterm(w) for w in workers), 120, "TensorFlow in both workers")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)  # a hang guard, not a timing: the message says what stopped them
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "convprobe train: stopped by SIGTERM; the 2 local workers were stopped"
    assert not any(Path(f"/proc/{w}").exists() for w in workers)
