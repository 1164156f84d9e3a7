"""`convprobe train --arm ... --seeds ...`: every (arm, seed) a real `convprobe train` process, one
`train-comparison` document, failures as rows, reruns that reuse finished runs, and `convprobe
report` drawing it. The runs are tiny (ResNet-8, 8x8 digits, batch 8, 2 steps, no XLA)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys

import pytest

from conftest import main_in_process, run_cli, wait_for
from convprobe import files, provenance, results
from convprobe.errors import InvalidArgument
from convprobe.options import Status
from convprobe.training.arms import parse_arms
from convprobe.training.compare import arm_statistics, plan_arms, run_arms
from convprobe.training.config import validate_config

TINY = ["--data", "digits", "--resnet-size", "8", "--batch-size", "8", "--steps", "2", "--record-every", "1",
        "--eval-batches", "2", "--no-jit"]


#: TINY, three steps long, with a checkpoint after each: a kill can land between checkpoints.
THREE_STEPS = [*(value if value != "2" or TINY[i - 1] != "--steps" else "3" for i, value in enumerate(TINY)),
               "--checkpoint-every", "1"]


def _summary(directory) -> dict:
    return json.loads((directory / "summary.json").read_text())["summary"]


def _digest(directory) -> dict:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.suffix in (".csv", ".npz")}


@pytest.mark.slow
@pytest.mark.tensorflow
def test_every_arm_at_every_seed_runs_and_a_rerun_reuses_them(tmp_path):
    out = tmp_path / "cmp"
    proc = run_cli("train", "--arm", "fp32", "--arm", "fp16/none@sequential:fp32", "--seeds", "0,1", *TINY,
                   "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = results.read(out / "comparison.json", kinds=("train-comparison",))
    assert document["params"]["arms"] == ["fp32", "fp16/none@sequential:fp32"]
    assert document["params"]["seeds"] == [0, 1] and document["params"]["shared"]["data"] == "digits"
    rows = {row["directory"]: row for row in document["runs"]}
    assert list(rows) == ["fp32_seed0", "fp32_seed1", "fp16-none--sequential-fp32_seed0",
                          "fp16-none--sequential-fp32_seed1"]
    for name, row in rows.items():
        summary = _summary(out / name)  # each run's own record, read independently
        assert row["status"] == Status.OK and row["error"] is None and not row["reused"]
        assert (row["eval_accuracy"], row["final_loss"], row["skipped_steps"], row["jit"]) == (
            summary["eval_accuracy"], summary["final_loss"], summary["skipped_steps"], False)
        header = json.loads((out / name / "header.json").read_text())
        assert header["params"]["eval_batches"] == 2 and header["params"]["seed"] == row["seed"]
        assert row["underflow"]["step"] == 1 and 0 <= row["underflow"]["worst"] <= 1
        assert (out / f"{name}.log").read_text().startswith("$ convprobe train --dtype ")
    assert rows["fp16-none--sequential-fp32_seed0"]["arithmetic"] == "sequential:fp32"
    for arm in document["arms"]:
        accuracies = [rows[n]["eval_accuracy"] for n in rows if rows[n]["arm"] == arm["arm"]]
        assert arm["runs"] == arm["finished"] == 2
        assert arm["eval_accuracy_mean"] == pytest.approx(statistics.fmean(accuracies), abs=0)
        assert arm["eval_accuracy_std"] == pytest.approx(statistics.stdev(accuracies), abs=0)
    assert "fp16/none@sequential:fp32" in proc.stdout and "ddof = 1" in proc.stdout

    before = _digest(out)
    again = run_cli("train", "--arm", "fp32", "--arm", "fp16/none@sequential:fp32", "--seeds", "0,1", *TINY,
                    "--output", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("finished before, reused") == 4 and "training" not in again.stderr
    assert _digest(out) == before
    rerun = results.read(out / "comparison.json")
    assert [r["reused"] for r in rerun["runs"]] == [True] * 4
    assert [(r["eval_accuracy"], r["final_loss"]) for r in rerun["runs"]] == [
        (r["eval_accuracy"], r["final_loss"]) for r in document["runs"]]

    code, printed, err = main_in_process(["report", str(out), "--out-dir", str(tmp_path / "fig"),
                                          "--formats", "png"])
    assert code == 0, err
    assert printed.split() == [str(tmp_path / "fig" / "cmp-table.png"), str(tmp_path / "fig" / "cmp-accuracy.png")]
    assert all((tmp_path / "fig" / f"cmp-{name}.png").stat().st_size > 5000 for name in ("table", "accuracy"))


@pytest.mark.tensorflow
def test_a_run_that_fails_is_a_row_and_the_others_still_count(tmp_path):
    base = validate_config(data="digits", resnet_size=8, batch_size=8, steps=2, record_every=1, eval_batches=2,
                           jit=False)
    out = tmp_path / "cmp"
    planned = plan_arms(base, parse_arms(["fp32"]), [0, 1], out, jit=False)
    (out / "fp32_seed1").mkdir(parents=True)  # after the plan, before its run: the child refuses it
    (out / "fp32_seed1" / "notes.txt").write_text("mine")
    document = run_arms(planned, out, echo=lambda text: None)
    ok, failed = document["runs"]
    assert ok["status"] == Status.OK and ok["eval_accuracy"] is not None
    assert failed["status"] == Status.FAILED and failed["eval_accuracy"] is None and failed["underflow"] is None
    assert failed["error"].startswith("exit status 2: ") and "holds files that are not a convprobe run" in failed["error"]
    assert document["arms"][0]["runs"] == 2 and document["arms"][0]["finished"] == 1
    assert document["arms"][0]["eval_accuracy_mean"] == ok["eval_accuracy"]
    assert document["arms"][0]["eval_accuracy_std"] is None  # one finished run: no sample std
    assert "fp32_seed1                               failed" in (out / "comparison.txt").read_text()
    assert (out / "fp32_seed1" / "notes.txt").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.tensorflow
def test_compare_loss_scaling_is_three_arms_through_the_same_code(tmp_path):
    out = tmp_path / "cmp"
    proc = run_cli("train", "--compare-loss-scaling", *TINY, "--loss-scale", "64", "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = results.read(out / "comparison.json", kinds=("train-comparison",))
    assert document["params"]["arms"] == ["fp16/none", "fp16/64", "fp16/dynamic"]
    assert [r["directory"] for r in document["runs"]] == ["fp16-none_seed0", "fp16-64_seed0", "fp16-dynamic_seed0"]
    assert all(r["status"] == Status.OK and r["eval_accuracy"] is not None for r in document["runs"])
    scales = [json.loads((out / r["directory"] / "header.json").read_text())["params"]["loss_scale"]
              for r in document["runs"]]
    assert [(s["mode"], s["scale"]) for s in scales] == [("none", 1.0), ("static", 64.0), ("dynamic", 2.0**15)]
    for name in ("underflow.csv", "underflow.txt", "underflow_per_layer.png", "gradient_histogram.png",
                 "scale_trajectory.png"):
        assert (out / name).stat().st_size > 0
    text = (out / "underflow.txt").read_text()
    assert "routing0" in text and "initial_conv" in text and "flush|lost:fp16-none_seed0" in text


def _document(rows: list[dict], arms: list[str]) -> dict:
    return results.envelope("train-comparison", {"arms": arms, "seeds": sorted({r["seed"] for r in rows}),
                                                 "shared": {"data": "digits", "steps": 5}},
                            provenance.collect(), runs=rows, arms=arm_statistics(rows, arms), notes={})


def _row(arm: str, seed: int, accuracy: float | None, status: str = "ok") -> dict:
    return {"arm": arm, "seed": seed, "directory": f"{arm.replace('/', '-')}_seed{seed}", "status": status,
            "error": None if status == "ok" else "exit status 1: boom", "reused": False, "jit": True,
            "eval_accuracy": accuracy, "final_loss": None if accuracy is None else 1 - accuracy,
            "skipped_steps": None if accuracy is None else 0, "nonfinite_steps": None, "final_step": None,
            "underflow": None, "seconds": 1.0}


def _twice(document: dict) -> None:
    document["runs"].append(dict(document["runs"][0]))
    document["arms"] = arm_statistics(document["runs"], document["params"]["arms"])


def _missing(document: dict) -> None:
    del document["runs"][1]  # the arms still count it


def _outside(document: dict) -> None:
    document["runs"][0]["directory"] = "../elsewhere/fp32_seed0"


def _renamed(document: dict) -> None:
    document["runs"][0]["directory"] = "fp32_seed1"  # the run at seed 0 named as seed 1's


def _kind(document: dict) -> None:
    document["kind"] = "train"  # then its fields would be checked as a train header's


def _swapped(document: dict) -> None:
    document["runs"][0]["directory"] = "fp16-128_seed0"  # arm fp32's run in arm fp16/128's directory
    document["runs"][2]["directory"] = "fp32_seed0"


@pytest.mark.parametrize("damage, message", [
    (_swapped, "runs[1].directory must be named like the other runs of arm fp32 (fp16-128_seed<k>, as runs[0]) "
               "and unlike any other arm's; received 'fp32_seed1'"),
    (_kind, "comparison.json holds a 'train' document; expected 'train-comparison'"),
    (_twice, "runs[4] must be the only run of arm fp32 at seed 0 (it repeats runs[0]); received 'fp32_seed0'"),
    (_missing, "runs must hold one row for each arm at each seed; none is there for fp32 at seed 1"),
    (_outside, "runs[0].directory must be a run directory inside the comparison named <arm>_seed0; received "
               "'../elsewhere/fp32_seed0'"),
    (_renamed, "runs[0].directory must be a run directory inside the comparison named <arm>_seed0; received "
               "'fp32_seed1'"),
])
def test_report_refuses_a_comparison_inconsistent_with_itself(tmp_path, damage, message):
    rows = [_row("fp32", 0, 0.9), _row("fp32", 1, 0.8), _row("fp16/128", 0, 0.85), _row("fp16/128", 1, 0.7)]
    document = _document(rows, ["fp32", "fp16/128"])
    damage(document)
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "comparison.json").write_text(json.dumps(document))
    code, printed, err = main_in_process(["report", str(tmp_path / "cmp"), "--out-dir", str(tmp_path / "fig")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.strip().endswith(message), err
    assert not (tmp_path / "fig").exists()


def test_report_draws_a_comparison_and_refuses_a_malformed_one_in_one_line(tmp_path):
    rows = [_row("fp32", 0, 0.9), _row("fp32", 1, 0.8), _row("fp16/128", 0, 0.85), _row("fp16/128", 1, None, "crashed")]
    document = _document(rows, ["fp32", "fp16/128"])
    assert document["arms"][0]["eval_accuracy_mean"] == pytest.approx(0.85, abs=1e-15)
    assert document["arms"][0]["eval_accuracy_std"] == pytest.approx(statistics.stdev([0.9, 0.8]), abs=0)
    assert (document["arms"][1]["finished"], document["arms"][1]["eval_accuracy_std"]) == (1, None)
    (tmp_path / "cmp").mkdir()
    results.write(tmp_path / "cmp" / "comparison.json", document)
    code, printed, err = main_in_process(["report", str(tmp_path / "cmp"), "--out-dir", str(tmp_path / "fig"),
                                          "--formats", "png,svg"])
    assert code == 0, err
    assert len(printed.split()) == 4 and all((tmp_path / "fig" / f"cmp-{n}.png").stat().st_size > 5000
                                             for n in ("table", "accuracy"))
    svg = (tmp_path / "fig" / "cmp-table.svg").read_text()
    assert "85.00 ± 7.07 %" in svg and "1/2" in svg

    document["arms"].reverse()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "comparison.json").write_text(json.dumps(document))
    code, printed, err = main_in_process(["report", str(tmp_path / "bad"), "--out-dir", str(tmp_path / "fig2")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "one row per arm of params.arms" in err, err
    assert not (tmp_path / "fig2").exists()


def _comparison_command(out) -> list[str]:
    return [sys.executable, "-m", "convprobe", "train", "--arm", "fp32", "--seeds", "0,1", *THREE_STEPS,
            "--output", str(out)]


def _killed_when(out, condition, what: str) -> None:
    """Start the comparison in a session of its own, SIGKILL its first process as soon as
    `condition(out)` holds, and wait until every process of the session is gone (its children
    die with it: `convprobe.children`)."""
    process = subprocess.Popen(_comparison_command(out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        wait_for(lambda: condition(out) or process.poll() is not None, 300, what, poll=0.005)
        assert process.poll() is None, f"the comparison ended (exit {process.returncode}) before {what}"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()

    def session_gone() -> bool:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(session_gone, 30, f"the children of a comparison killed at {what} to die")


def _attempts(log) -> int:
    """How many times a run was started: each start writes its command line into its log."""
    return log.read_text().count("$ convprobe") if log.exists() else 0


@pytest.mark.tensorflow
def test_a_comparison_killed_at_any_moment_resumes_and_records_each_run_once(tmp_path):
    out = tmp_path / "cmp"
    first, second = out / "fp32_seed0", out / "fp32_seed1"
    def started(log):  # a run started since the kill before: its log holds one more command line
        before = _attempts(log)
        return lambda: _attempts(log) > before

    def exists(path):
        return lambda: path.exists()

    # (when to kill, made just before the rerun starts; what must not exist yet when the kill has landed)
    moments = {
        "the first run's start, before its header": (lambda: started(out / "fp32_seed0.log"), first / "header.json"),
        "the first run's first checkpoint": (lambda: exists(first / "checkpoint.npz"), first / "summary.json"),
        "the first run's end": (lambda: exists(first / "summary.json"), second / "header.json"),
        "the second run's start, before its header": (lambda: started(out / "fp32_seed1.log"),
                                                      second / "header.json"),
        "the second run's header": (lambda: exists(second / "header.json"), second / "summary.json"),
    }
    for what, (make_condition, not_yet) in moments.items():  # each rerun goes on from what the last left
        condition = make_condition()
        _killed_when(out, lambda _: condition(), what)
        assert not not_yet.exists(), f"the kill at {what} landed after {not_yet.name} was written"
    first_summary = (first / "summary.json").read_bytes()

    final = subprocess.run(_comparison_command(out), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    document = results.read(out / "comparison.json", kinds=("train-comparison",))
    rows = {row["directory"]: row for row in document["runs"]}
    assert list(rows) == ["fp32_seed0", "fp32_seed1"], rows
    assert [(r["status"], r["reused"]) for r in rows.values()] == [(Status.OK, True), (Status.OK, False)]
    assert (first / "summary.json").read_bytes() == first_summary  # reused, not run again
    assert json.loads((first / "header.json").read_text())["resumed_at_steps"][-1] >= 1  # from its checkpoint
    for name in rows:
        steps = [line.split(",")[0] for line in (out / name / "steps.csv").read_text().splitlines()[1:]]
        assert steps == ["0", "1", "2"], f"{name}: steps recorded {steps}, each of 0..2 once expected"
        assert _summary(out / name)["final_step"] == 3
    assert document["arms"][0]["runs"] == document["arms"][0]["finished"] == 2


def test_what_a_comparison_killed_before_any_header_leaves_is_its_own(tmp_path):
    """The states a kill can leave before any run writes a header (the lock only; the lock, a
    run's log and its folder with the run's own lock): planned again, not refused."""
    base = validate_config(data="digits", resnet_size=8, batch_size=8, steps=2, record_every=1, eval_batches=2,
                           jit=False)
    out = tmp_path / "cmp"
    out.mkdir()
    (out / files.LOCK_NAME).write_text("123 convprobe comparison")  # no process holds it any more
    assert [run.name for run in plan_arms(base, parse_arms(["fp32"]), [0], out, jit=False)] == ["fp32_seed0"]
    (out / "fp32_seed0.log").write_text("$ convprobe train ...\n")
    (out / "fp32_seed0").mkdir()
    (out / "fp32_seed0" / files.LOCK_NAME).write_text("124 convprobe run")
    assert [run.name for run in plan_arms(base, parse_arms(["fp32"]), [0], out, jit=False)] == ["fp32_seed0"]
    (out / files.LOCK_NAME).unlink()  # without its lock nothing says the log is convprobe's: a user's files
    with pytest.raises(InvalidArgument, match="holds files that are not a convprobe comparison"):
        plan_arms(base, parse_arms(["fp32"]), [0], out, jit=False)


@pytest.mark.tensorflow
def test_a_second_comparison_on_a_running_one_is_told_who_holds_it(tmp_path):
    out = tmp_path / "cmp"
    first = subprocess.Popen(_comparison_command(out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        wait_for(lambda: (out / "fp32_seed0.log").exists(), 120, "the first comparison's first run")
        second = run_cli(*_comparison_command(out)[3:])
        assert second.returncode == 2, second.stderr
        line = second.stderr.strip()
        assert line == (f"convprobe train: error: --output {str(out)!r} is in use by another convprobe comparison "
                        f"(pid {first.pid}); nothing was changed: wait for it to end or use another directory"), line
        assert (out / "fp32_seed0.log").read_text().count("$ convprobe") == 1  # the second started nothing
        assert not (out / "comparison.json").exists()
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
