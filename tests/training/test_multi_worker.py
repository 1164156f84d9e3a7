"""`--distribute multi-worker` (MultiWorkerMirroredStrategy) rehearsed with 2 local workers.

Two workers of batch 8 each are the same arithmetic as one process mirrored over 2 logical
devices, and the records are equal to the bit. One undistributed process with the same global
batch differs, for one reason: batch normalisation normalises each replica's 8 images with
their own statistics; its step-0 loss, recomputed per half of the batch, is the workers' one.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from convprobe.formats import FP32

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
