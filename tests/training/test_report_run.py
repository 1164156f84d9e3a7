"""`convprobe report` draws a real training run (its directory or its header.json) and refuses a
damaged one in one line, writing nothing."""

from __future__ import annotations

import json
import os
import stat

import pytest

from convprobe import cli
from convprobe.training.config import validate_config
from convprobe.training.records import IDENTIFY_MAP_NAME, RUN_DIRECTORY_NAMES, RUN_FILE_NAMES
from convprobe.training.run_loop import train

from .conftest import TINY


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "fp16-run"
    old = os.umask(0o022)
    try:
        train(validate_config(steps=3, record_every=1, checkpoint_every=2, output=str(out), **TINY), eager=True)
    finally:
        os.umask(old)
    return out


def test_every_record_of_a_run_is_0644_under_umask_022(run_dir):
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir() if p.is_file()}
    assert set(modes) == set(RUN_FILE_NAMES) - {IDENTIFY_MAP_NAME}  # the records and the run's lock (no twin here)
    assert set(modes.values()) == {0o644}, modes
    directories = [p for p in run_dir.iterdir() if p.is_dir()]
    assert {p.name for p in directories} == set(RUN_DIRECTORY_NAMES)  # the TensorBoard event files
    inside = {stat.S_IMODE(p.stat().st_mode) for d in directories for p in d.iterdir()}
    assert inside == {0o644}, inside


@pytest.mark.parametrize("target", ["directory", "header.json", "summary.json"])
def test_report_draws_a_training_run(run_dir, tmp_path, capsys, target):
    path = run_dir if target == "directory" else run_dir / target
    assert cli.main(["report", str(path), "--out-dir", str(tmp_path), "--formats", "png"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "fp16-run-run.png")]
    assert (tmp_path / "fp16-run-run.png").stat().st_size > 10_000


DAMAGE = {
    "steps column": ("steps.csv", lambda text: text.replace("loss_scale", "scale", 1), "steps.csv has columns"),
    "loss not a number": ("steps.csv", lambda text: text.replace("\n1,", "\n1,oops", 1), "column 'loss'"),
    "header layers": ("header.json", lambda text: json.dumps({**json.loads(text), "layers": []}),
                      "layers must be an object"),
    "header version": ("header.json", lambda text: json.dumps({**json.loads(text), "schema_version": 99}),
                       "schema_version 99"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_run_is_one_line_and_nothing_is_written(run_dir, tmp_path, capsys, damage):
    import shutil

    name, change, message = DAMAGE[damage]
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / name).write_text(change((copy / name).read_text()))
    assert cli.main(["report", str(copy), "--out-dir", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "f").exists()


def test_telemetry_columns_are_defined_and_say_what_they_measure(run_dir):
    import pandas as pd

    header = json.loads((run_dir / "header.json").read_text())
    for part in ("steps", "telemetry"):
        assert set(header["column_definitions"][part]) == set(header["columns"][part])
    t = pd.read_csv(run_dir / "telemetry.csv", keep_default_na=False)
    assert ((t["flushed"] + t["lost"]) / t["n"] == t["underflow_fraction"]).all()
    weights = t[t["kind"] == "weight"]
    batch_norm = weights["layer"].str.contains("_bn/")
    assert batch_norm.any() and (weights.loc[batch_norm, "precision"] == "fp32").all()
    assert (weights.loc[~batch_norm, "precision"] == "fp16").all()
    assert (weights.loc[batch_norm, "flushed"] == 0).all()  # fp32 gradients cannot flush
    taps = t[t["kind"] == "activation"]
    shared = taps[taps["same_gradient_as"] != ""]
    assert len(shared)  # a block's add and its conv2 carry one gradient
    for row in shared.itertuples(index=False):
        source = taps[(taps["layer"] == row.same_gradient_as) & (taps["step"] == row.step)].iloc[0]
        assert (source["n"], source["flushed"], source["subnormal"]) == (row.n, row.flushed, row.subnormal)
