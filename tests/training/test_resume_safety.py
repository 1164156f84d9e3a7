"""A resume validates the header and checkpoint completely before it changes anything: a
corrupt or foreign run directory costs no record, and TensorFlow is not even imported."""

import csv
import hashlib
import json

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from convprobe.errors import InvalidArgument
from convprobe.training.config import validate_config
from convprobe.training.records import (STEP_COLUMNS, TELEMETRY_COLUMNS, RunFiles, _truncate_csv, load_checkpoint,
                                        read_header)

from .recorded import recorded_config, recorded_run

ARGS = ["--batch-size", "8", "--resnet-size", "8", "--image-size", "8", "--record-every", "1",
        "--checkpoint-every", "2"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "convprobe", *args], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL, timeout=600)


def _config(output, steps=6):
    return recorded_config(output, steps)


def _run_dir(tmp_path):
    return recorded_run(tmp_path)


def _digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


BAD_CHECKPOINTS = {
    "counters": lambda p: np.savez(p, w0=np.zeros(3), next_step=np.array(2), counters=np.array("{}")),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "not a zip": lambda p: p.write_text("hello"),
    "no step": lambda p: np.savez(p, w0=np.zeros(3), counters=np.array('{"skipped": 0, "nonfinite": 0}')),
    "step zero": lambda p: np.savez(p, w0=np.zeros(3), next_step=np.array(0),
                                    counters=np.array('{"skipped": 0, "nonfinite": 0}')),
    "pickled": lambda p: np.savez(p, w0=np.array([{"a": 1}], dtype=object), next_step=np.array(2),
                                  counters=np.array('{"skipped": 0, "nonfinite": 0}')),
}


@pytest.mark.parametrize("damage", sorted(BAD_CHECKPOINTS))
def test_a_bad_checkpoint_is_refused_and_nothing_changes(tmp_path, damage):
    out = _run_dir(tmp_path)
    BAD_CHECKPOINTS[damage](out / "checkpoint.npz")
    before = _digest(out)
    with pytest.raises(InvalidArgument, match="is not a usable convprobe checkpoint .*nothing was changed"):
        RunFiles(out).plan(_config(out).to_json())
    assert _digest(out) == before


@pytest.mark.parametrize("text", ['{"config": ', "[]", '{"config": 3}', "", '{"schema_version": 2, "kind": "train"}',
                                  '{"schema_version": 9, "kind": "train", "params": {}, "provenance": {}}'])
def test_a_bad_header_is_refused_and_nothing_changes(tmp_path, text):
    out = _run_dir(tmp_path)
    (out / "header.json").write_text(text)
    before = _digest(out)
    with pytest.raises(InvalidArgument, match="header"):
        RunFiles(out).plan(_config(out).to_json())
    assert _digest(out) == before


#: telemetry.csv's columns as convprobe 0.1 wrote them (before precision, same_gradient_as, underflow_fraction).
V1_TELEMETRY = [c for c in TELEMETRY_COLUMNS if c not in ("precision", "same_gradient_as", "underflow_fraction")]


def _v1_header(header: dict, telemetry_columns) -> dict:
    """`header` in convprobe 0.1's layout: no version or kind, the configuration under 'config'."""
    return {"config": header["params"], "provenance": {}, "resumed_at_steps": header["resumed_at_steps"],
            "columns": {"steps": list(STEP_COLUMNS), "telemetry": list(telemetry_columns)},
            "layers": header["layers"], "histogram_bins": header["histogram_bins"]}


def test_a_version_1_header_is_upgraded_on_read(tmp_path):
    out = _run_dir(tmp_path)
    header = json.loads((out / "header.json").read_text())
    (out / "header.json").write_text(json.dumps(_v1_header(header, TELEMETRY_COLUMNS)))
    before = _digest(out)
    assert read_header(out)["kind"] == "train" and read_header(out)["params"] == header["params"]
    plan = RunFiles(out).plan(_config(out).to_json())
    assert (plan.start_step, plan.resumed) == (4, [4])
    assert _digest(out) == before


def test_a_version_1_run_with_the_old_telemetry_columns_is_refused_untouched(tmp_path):
    out = _run_dir(tmp_path)
    header = json.loads((out / "header.json").read_text())
    (out / "header.json").write_text(json.dumps(_v1_header(header, V1_TELEMETRY)))
    before = _digest(out)
    with pytest.raises(InvalidArgument, match="was recorded with other columns .*nothing was changed"):
        RunFiles(out).plan(_config(out).to_json())
    assert _digest(out) == before


def test_the_issue_s_repro_from_the_cli_leaves_every_file_and_imports_no_tensorflow(tmp_path):
    out = _run_dir(tmp_path)
    np.savez(out / "checkpoint.npz", w0=np.zeros(3), next_step=np.array(2), counters=np.array("{}"))
    before = _digest(out)
    proc = run_cli("train", "--steps", "6", *ARGS, "--output", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "checkpoint" in proc.stderr  # one line, no TF logs
    assert _digest(out) == before


def test_a_valid_checkpoint_plans_a_resume_without_writing(tmp_path):
    out = _run_dir(tmp_path)
    before = _digest(out)
    plan = RunFiles(out).plan(_config(out).to_json())
    assert (plan.start_step, plan.resumed, plan.checkpoint[0]) == (4, [4], 4)
    assert _digest(out) == before


def test_a_changed_configuration_is_refused(tmp_path):
    out = _run_dir(tmp_path)
    other = validate_config(batch_size=16, resnet_size=8, image_size=8, record_every=1, checkpoint_every=2,
                            steps=6, output=str(out)).to_json()
    with pytest.raises(InvalidArgument) as info:
        RunFiles(out).plan(other)
    assert str(info.value) == (f"--output '{out}' holds a run with a different batch_size (8 there, 16 now); "
                               f"nothing was changed: resume it with the same settings, or use a new --output "
                               f"directory")
    scaled = validate_config(batch_size=8, resnet_size=8, image_size=8, record_every=1, checkpoint_every=2,
                             steps=6, output=str(out), loss_scale="dynamic").to_json()
    with pytest.raises(InvalidArgument, match=r"different loss_scale \(static 128 there, dynamic now\)"):
        RunFiles(out).plan(scaled)


def test_truncation_drops_malformed_rows_and_rows_past_the_checkpoint(tmp_path):
    path = tmp_path / "steps.csv"
    width = len(STEP_COLUMNS) - 1
    rows = [list(STEP_COLUMNS), [0] + ["1"] * width, ["1", "2.0"], ["x"] + ["1"] * width, [2] + ["1"] * width]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    _truncate_csv(path, 2, STEP_COLUMNS)
    with path.open(newline="") as handle:
        kept = list(csv.reader(handle))
    assert [r[0] for r in kept] == ["step", "0"]


def test_unusable_output_paths_are_refused_before_any_work(tmp_path):
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(InvalidArgument, match="is a file; it must be a run directory"):
        RunFiles(plain).plan({})
    with pytest.raises(InvalidArgument, match="cannot be written"):
        RunFiles(plain / "run").plan({})


def test_load_checkpoint_round_trips_what_save_writes(tmp_path):
    from convprobe.training.records import save_checkpoint

    path = tmp_path / "c.npz"
    save_checkpoint(path, 3, [np.ones(2)], [np.zeros(1)], {"skipped": 1, "nonfinite": 0})
    step, weights, opt, counters = load_checkpoint(path)
    assert (step, counters) == (3, {"skipped": 1, "nonfinite": 0})
    assert np.array_equal(weights[0], np.ones(2)) and np.array_equal(opt[0], np.zeros(1))


def test_an_unreadable_record_file_is_refused_before_the_header_changes(tmp_path):
    out = _run_dir(tmp_path)
    with (out / "steps.csv").open("ab") as handle:
        handle.write(b"5,\xff\xfe\n")
    before = _digest(out)
    with pytest.raises(InvalidArgument, match="steps.csv is not a readable convprobe record"):
        RunFiles(out).plan(_config(out).to_json())
    assert _digest(out) == before


def test_a_resume_with_another_replica_count_is_refused_untouched(tmp_path):
    from convprobe.training.run_loop import train

    out = _run_dir(tmp_path)
    header = json.loads((out / "header.json").read_text())
    header["provenance"]["runtime"] = {"replicas": 2}  # recorded by two workers
    (out / "header.json").write_text(json.dumps(header))
    before = _digest(out)
    with pytest.raises(InvalidArgument, match="recorded with 2 replicas and this run has 1 .*nothing was changed"):
        train(_config(out), eager=True)
    assert _digest(out) == before


def test_a_finished_run_asked_for_another_evaluation_is_refused_not_reported_as_if_evaluated(tmp_path):
    from dataclasses import replace

    from convprobe import results
    from convprobe.training.run_loop import train

    out = _run_dir(tmp_path)
    summary = {"finished": True, "final_step": 4, "skipped_steps": 0, "nonfinite_steps": 0, "final_loss_scale": 128.0,
               "final_loss": 2.3, "eval_accuracy": None, "median_images_per_second": 80.0, "jit": False}
    (out / "summary.json").write_text(json.dumps(results.envelope("train-summary", {}, {"seed": 0}, summary=summary)))
    before = _digest(out)
    finished = replace(_config(out, steps=4), eval_batches=8)
    with pytest.raises(InvalidArgument, match="finished with --eval-batches 0; nothing was changed"):
        train(finished)
    assert _digest(out) == before
    assert train(replace(finished, eval_batches=0)).final_step == 4  # the same question: reported as it was


@pytest.mark.tensorflow
def test_a_checkpoint_of_another_model_is_refused_naming_what_differs(tmp_path):
    out = _run_dir(tmp_path)  # its checkpoint holds one weight of 3 elements: not a ResNet-8's
    before = _digest(out)
    proc = run_cli("train", "--steps", "6", *ARGS, "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("convprobe train: error: the checkpoint does not match this run's model (--resnet-size 8, "
                           "--image-size 8): it holds 1 weights, this model has "), line
    assert line.endswith("; nothing was changed: resume it with the model it was saved from, or use a new --output "
                         "directory"), line
    assert _digest(out) == before
