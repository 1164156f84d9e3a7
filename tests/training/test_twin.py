"""The training twin end to end, through the command line in fresh processes: a step whose
every identified conv op runs in the emulator reproduces TensorFlow's own training bit for
bit (losses and final weights), and the same comparison fails when one op's model is wrong."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

RUN = ["--config", "onednn-off+fp16-acc", "--no-jit", "--steps", "2", "--resnet-size", "8", "--image-size", "8",
       "--batch-size", "8", "--record-every", "1"]


def _train(tmp_path: Path, name: str, *extra: str) -> tuple[list[str], dict]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "convprobe", "train", *RUN, "--output", str(tmp_path / name), *extra],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / name / "steps.csv", newline="") as handle:
        losses = [row["loss"] for row in csv.DictReader(handle)]
    return losses, json.loads((tmp_path / name / "summary.json").read_text())["summary"]


def test_the_twin_reproduces_tensorflows_training_and_a_wrong_model_does_not(tmp_path):
    native_losses, native = _train(tmp_path, "native")
    twin_losses, twin = _train(tmp_path, "twin", "--arithmetic", "twin")
    header = json.loads((tmp_path / "twin" / "header.json").read_text())["arithmetic"]
    assert header["emulated_ops"] >= 20, header
    assert twin_losses == native_losses
    assert twin["weights_sha256"] == native["weights_sha256"]
    # The same map with one measured model replaced by another: the twin must now differ.
    document = json.loads((tmp_path / "twin" / "identify.json").read_text())
    (label, cells), = document["matches"].items()
    key = next(k for k, cell in cells.items() if k.endswith("/ conv2d_backprop_filter") and cell["summary"]["perfect"])
    cells[key]["summary"]["perfect"] = ["sequential:fp32:output=fp16"]  # the twin takes the best of these
    cells[key]["summary"]["best"] = "sequential:fp32:output=fp16"
    (tmp_path / "wrong.json").write_text(json.dumps(document))
    wrong_losses, wrong = _train(tmp_path, "wrong", "--arithmetic", "twin", "--arithmetic-map", str(tmp_path / "wrong.json"))
    assert wrong["weights_sha256"] != native["weights_sha256"], f"{key}: a wrong model changed nothing"
