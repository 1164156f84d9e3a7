"""scripts/identify_models.py: a battery's models by K range, per pair and grouped by op."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "identify_models.py"
# At K <= 64 one chunk of 4096 is the plain chain, so these two configurations share every model.
SAME_AT_SHORT_K = ("sequential:fp16", "chunked:fp16:n=4096:total=fp16")
OTHER = "chunked:fp16:n=16:total=fp16"


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("battery") / "battery.json"
    models = [arg for spec in (*SAME_AT_SHORT_K, OTHER) for arg in ("--model", spec)]
    subprocess.run([sys.executable, "-m", "convprobe", "identify", "--configs", "none", *models,
                    "--op", "conv2d,matmul", "--ks", "16,64", "--rows", "8", "--output", str(path)],
                   check=True, capture_output=True, text=True)
    return path


def _table(*args: str) -> list[list[str]]:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, text=True).stdout
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()[2:]]


def test_one_row_per_pair_with_each_k_range_s_model(battery):
    rows = _table(str(battery))
    assert len(rows) == 3 * 2
    assert ["chunked:fp16:n=4096:total=fp16", "conv2d", "K 16–64: `sequential:fp16`"] in rows
    assert [OTHER, "matmul", "K 16: `sequential:fp16`<br>K 64: `chunked:fp16:n=16:total=fp16`"] in rows


def test_by_op_groups_the_configurations_that_share_every_model(battery):
    rows = _table("--by-op", str(battery))
    assert [row[0] for row in rows] == ["conv2d", "conv2d", "matmul", "matmul"]  # ops in battery order
    assert rows[0] == ["conv2d", ", ".join(SAME_AT_SHORT_K), "K 16–64: `sequential:fp16`"]
    assert rows[1][1] == OTHER


def test_a_missing_file_is_one_line_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.json")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"error: results file '{tmp_path / 'none.json'}' does not exist"]
