"""scripts/identify_models.py: a battery's models by K range, per pair and grouped by op."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "identify_models.py"
_spec = importlib.util.spec_from_file_location("identify_models", SCRIPT)
identify_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(identify_models)

# At K <= 64 one chunk of 4096 is the plain chain, so these two configurations share every model.
SAME_AT_SHORT_K = ("sequential:fp16", "chunked:fp16:n=4096:total=fp16")
OTHER = "chunked:fp16:n=16:total=fp16"


def _entry(best, fraction=1.0):
    return {"best": best, "fraction": fraction}


def test_ranges_join_equal_neighbours_and_say_where_there_is_no_model():
    per_k = {"64": _entry("b"), "16": _entry("a"), "32": _entry("a"), "128": _entry(None, 0.5),
             "256": _entry("b", 0.99951)}
    assert identify_models._ranges(per_k) == [
        "K 16–32: `a`", "K 64: `b`", "K 128: not a direct sum of products", "K 256: `b` (99.9%)"]


def test_a_match_below_one_never_reads_one_hundred_percent():
    assert identify_models._share(0.99999) == "99.9%"
    assert identify_models._share(0.5) == "50.0%"


def test_by_op_groups_on_the_models_not_on_their_rounded_text():
    a = {"16": _entry("x", 0.99951)}
    b = {"16": _entry("x", 0.99959)}  # prints as a's cell, and is another result
    rows = [("c1", "conv2d", a, "same"), ("c2", "conv2d", dict(a), "same"), ("c3", "conv2d", b, "same"),
            ("c1", "matmul", None, "crashed: boom"), ("c2", "matmul", None, "crashed: boom")]
    assert identify_models.by_op(rows) == [("conv2d", "c1, c2", "same"), ("conv2d", "c3", "same"),
                                           ("matmul", "c1, c2", "crashed: boom")]


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("battery") / "battery.json"
    models = [arg for spec in (*SAME_AT_SHORT_K, OTHER) for arg in ("--model", spec)]
    proc = subprocess.run([sys.executable, "-m", "convprobe", "identify", "--configs", "none", *models,
                           "--op", "matmul,conv2d", "--ks", "16,64", "--rows", "8", "--output", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(proc.stderr)
    return path


def _table(*args: str) -> tuple[list[str], list[list[str]]]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    return lines[:2], [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_one_row_per_pair_with_each_k_range_s_model(battery):
    header, rows = _table(str(battery))
    assert header == ["| configuration | op | model at each K (match 100% unless shown) |", "|---|---|---|"]
    assert len(rows) == 3 * 2
    assert ["chunked:fp16:n=4096:total=fp16", "conv2d", "K 16–64: `sequential:fp16`"] in rows
    assert [OTHER, "matmul", "K 16: `sequential:fp16`<br>K 64: `chunked:fp16:n=16:total=fp16`"] in rows


def test_by_op_groups_the_configurations_that_share_every_model(battery):
    header, rows = _table("--by-op", str(battery))
    assert header[0] == "| op | configurations | model at each K (match 100% unless shown) |"
    assert [row[0] for row in rows] == ["matmul", "matmul", "conv2d", "conv2d"]  # the battery's order
    for op in ("matmul", "conv2d"):
        assert [op, ", ".join(SAME_AT_SHORT_K), "K 16–64: `sequential:fp16`"] in rows
        assert [op, OTHER, "K 16: `sequential:fp16`<br>K 64: `chunked:fp16:n=16:total=fp16`"] in rows


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: results file '{tmp_path / 'none.json'}' does not exist"]
