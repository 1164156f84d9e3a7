"""scripts/specs_on_fresh_inputs.py: a map's specs against TensorFlow on inputs identify never saw."""

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, run_cli_json


def _counts(document, tmp_path) -> dict[str, tuple[int, int]]:
    path = tmp_path / "map.json"
    path.write_text(json.dumps(document))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "specs_on_fresh_inputs.py"), str(path), "--seed", "7"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(r"\| \S+ \| (\w+) \| (\d+) of (\d+) \|", proc.stdout)
    return {op: (int(equal), int(total)) for op, equal, total in rows}


@pytest.mark.tensorflow
def test_measured_specs_reproduce_tensorflow_and_a_wrong_one_does_not(tmp_path):
    document = run_cli_json("identify", "--configs", "onednn-off+fp16-acc", "--input-shape", "1,6,6,64",
                            "--filter-shape", "3,3,64,8")
    counts = _counts(document, tmp_path)
    assert set(counts) == {"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"}
    assert all(equal == total > 0 for equal, total in counts.values()), counts
    entry = document["matches"]["tensorflow/cpu/onednn-off+fp16-acc"]["conv2d"]
    entry["summary"]["best"] = "sequential:fp32:output=fp16"  # not what TensorFlow does here (K = 576)
    equal, total = _counts(document, tmp_path)["conv2d"]
    assert equal < total, (equal, total)
