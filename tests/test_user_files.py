"""A user's files are never touched: outputs are checked before any work, never written through a
link, a write that fails only when it happens leaves the old file and exits 3, and a run
directory is convprobe's own, locked while a run writes it."""

import hashlib
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import main_in_process
from convprobe import files, results
from convprobe.errors import InvalidArgument, OutputWriteFailed
from convprobe.probes import sweep
from training.recorded import RECORDED_ARGS, recorded_run

REPO = Path(__file__).resolve().parents[1]
EMULATED = ["overflow", "--backend", "emulated"]
TINY_RUN = ["--steps", "2", "--resnet-size", "8", "--image-size", "8", "--batch-size", "4", "--no-jit"]


def _cli(*args, limit_file_size: int | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    def limit():
        if limit_file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    return subprocess.run([sys.executable, "-m", "convprobe", *args], capture_output=True, text=True, cwd=REPO,
                          stdin=subprocess.DEVNULL, timeout=timeout, preexec_fn=limit,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _digest(directory: Path) -> dict[str, str]:
    """Every entry below `directory`, links as their targets' text, files by content."""
    found = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            found[key] = "-> " + os.readlink(path)
        elif path.is_file():
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[key] = "dir"
    return found


def _one_line(err: str) -> str:
    """The one line convprobe wrote (TensorFlow's own start-up lines, which it writes before its
    logging is set up, are not convprobe's)."""
    lines = [line for line in err.strip().splitlines() if not _TENSORFLOW_LOG.match(line)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


_TENSORFLOW_LOG = re.compile(r"^(WARNING: All log messages before absl|[IWE]\d{4} )")


# -- outputs checked before any work ------------------------------------------------------------


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's own file")
    return outside


OUTPUT_CASES = {
    "empty name": (lambda t: "", "argument --output: received an empty value; it takes FILE"),
    "blank name": (lambda t: " ", "argument --output: received an empty value"),
    "NUL byte": (lambda t: str(t / "a\0b.json"), "must not contain a NUL byte"),
    "name too long": (lambda t: str(t / ("n" * 300 + ".json")), "has a name of 305 bytes; at most 255"),
    "path too long": (lambda t: str(t / "/".join(["d" * 200] * 25) / "o.json"), "bytes long as an absolute path"),
    "dangling parent": (lambda t: str(t / "dangling" / "o.json"), "its parent"),
    "parent is a file": (lambda t: str(t / "outside.txt" / "o.json"), "is not a directory"),
    "link to a file": (lambda t: str(t / "link.json"), "is a symbolic link"),
    "FIFO": (lambda t: str(t / "fifo.json"), "is not a regular file (a device, FIFO or socket)"),
    "device": (lambda t: "/dev/null", "is not a regular file"),
    "device by a link": (lambda t: "/dev/stdout", "is a symbolic link"),
    "directory": (lambda t: str(t), "--output must be a file path"),
}


@pytest.mark.parametrize("case", OUTPUT_CASES)
def test_a_bad_output_is_one_line_before_any_work_and_touches_nothing(tmp_path, case):
    outside = _outside(tmp_path)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "link.json").symlink_to(outside)
    os.mkfifo(tmp_path / "fifo.json")
    before = _digest(tmp_path)
    path, message = OUTPUT_CASES[case]
    code, out, err = main_in_process([*EMULATED, "--output", path(tmp_path)])
    assert code == 2 and message in _one_line(err), err
    assert out == "" and _digest(tmp_path) == before


@pytest.mark.parametrize("argv,message", [
    ([*EMULATED, "--model", "sequential:fp16", "--model", "v100"], "argument --model: given twice"),
    ([*EMULATED, "--output", "a.json", "--output", "b.json"], "argument --output: given twice"),
    (["overflow", "--env", "A=1", "--env", "A=2"], "env sets A twice"),
    (["identify", "--configs", "none", "--model", "v100", "--model", "v100:out=fp32"],
     "--model names emulated/v100 twice"),
    (["train", "--steps", "3", "--steps", "4"], "argument --steps: given twice"),
])
def test_an_option_that_cannot_repeat_is_refused_when_repeated(argv, message):
    code, out, err = main_in_process(argv)
    assert code == 2 and message in _one_line(err) and out == ""


def test_a_write_that_fails_when_it_happens_leaves_the_old_file_and_exits_3(tmp_path):
    target = tmp_path / "old.json"
    target.write_text("x" * 5000)
    proc = _cli(*EMULATED, "--output", str(target), limit_file_size=2048)
    assert proc.returncode == 3, proc.stderr
    assert "could not write" in _one_line(proc.stderr) and "File too large" in proc.stderr
    assert target.read_text() == "x" * 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no temporary file left


def test_write_atomic_replaces_a_link_never_its_target(tmp_path):
    outside = _outside(tmp_path)
    (tmp_path / "link").symlink_to(outside)
    files.write_atomic(tmp_path / "link", "new")
    assert outside.read_text() == "the user's own file"
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "link").read_text() == "new"


def test_open_append_refuses_a_link_and_a_fifo(tmp_path):
    outside = _outside(tmp_path)
    (tmp_path / "link.csv").symlink_to(outside)
    os.mkfifo(tmp_path / "fifo.csv")
    with pytest.raises(InvalidArgument, match="is a symbolic link"):
        files.open_append(tmp_path / "link.csv")
    with pytest.raises(InvalidArgument, match="is not a regular file"):
        files.open_append(tmp_path / "fifo.csv")  # and does not block waiting for a reader
    assert outside.read_text() == "the user's own file"


def test_a_failed_write_names_the_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "kept.json"
    target.write_text("old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8, hard))
    try:
        with pytest.raises(OutputWriteFailed, match="could not write .*kept.json.*the previous file"):
            files.write_atomic(target, "a text longer than eight bytes")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["kept.json"]


# -- values checked at the boundary ------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["train", "--seed", str(2**32)], "--seed must be an integer from 0 to 2**32 - 1"),
    (["train", "--loss-scale", "1e39"], "--loss-scale must be none, dynamic or a positive number from 2**-126"),
    (["train", "--loss-scale", "1e-45"], "--loss-scale must be none, dynamic or a positive number from 2**-126"),
    (["train", "--resnet-size", "1202"], "--resnet-size must be 6n+2 from 8 to 272"),
    (["train", "--data-dir", "/tmp"], "--data-dir is read only with --data cifar10"),
    (["train", "--data", "cifar10", "--data-dir", "/tmp", "--image-size", "8"],
     "--image-size must be 32 with --data cifar10"),
    (["train", "--output", ""], "argument --output: received an empty value; it takes DIR"),
    (["train", "--devices", "4"], "--devices applies to --distribute mirrored"),
    (["train", "--dynamic-growth-steps", "10"], "--dynamic-growth-steps applies to --loss-scale dynamic"),
    (["train", "--no-skip", "--loss-scale", "none"], "--no-skip applies to a static --loss-scale"),
    (["compare", "--batch", "1", "--channels", "8192", "--filters", "8192", "--kernel", "32", "--height", "32",
      "--width", "32"], "GiB (half this machine's memory)"),
])
def test_a_value_beyond_what_the_layer_below_takes_is_refused(tmp_path, argv, message):
    code, out, err = main_in_process([*argv, *(["--output", str(tmp_path / "run")] if "--output" not in argv
                                     and argv[0] == "train" else [])])
    assert code == 2 and message in _one_line(err), err
    assert not (tmp_path / "run").exists()


def test_sweep_memory_counts_rows_times_k():
    assert sweep.memory_estimate(4096, 65536) == 2 * sweep.memory_estimate(2048, 65536)
    with pytest.raises(InvalidArgument, match="--rows 4096 at K = 244140625 needs about"):
        sweep.check_size(4096, [16, 10**12 // 4096])


# -- run directories ---------------------------------------------------------------------------


def _user_directory(tmp_path: Path) -> Path:
    """A user's own directory that happens to hold files with the names a run writes."""
    directory = tmp_path / "mine"
    directory.mkdir()
    (directory / "summary.json").write_text('{"my": "summary"}')
    (directory / "steps.csv").write_text("my,own\n1,2\n")
    (directory / "notes.txt").write_text("notes")
    return directory


@pytest.mark.parametrize("extra", [[], ["--compare-loss-scaling"]])
def test_train_refuses_a_directory_of_a_user_s_files_untouched(tmp_path, extra):
    directory = _user_directory(tmp_path)
    before = _digest(tmp_path)
    code, out, err = main_in_process(["train", *TINY_RUN, *extra, "--output", str(directory)])
    assert code == 2 and "holds files that are not a convprobe" in _one_line(err), err
    assert _digest(tmp_path) == before


@pytest.mark.parametrize("planted", ["steps.csv", "telemetry.csv", "checkpoint.npz", "header.json",
                                     "summary.json", files.LOCK_NAME])
def test_a_link_planted_in_a_run_directory_is_refused_never_followed(tmp_path, planted):
    run = recorded_run(tmp_path)
    outside = _outside(tmp_path)
    (run / planted).unlink(missing_ok=True)
    (run / planted).symlink_to(outside)
    before = _digest(tmp_path)
    code, out, err = main_in_process(["train", "--steps", "6", *RECORDED_ARGS, "--output", str(run)])
    assert code == 2 and f"{planted} is a symbolic link" in _one_line(err), err
    assert _digest(tmp_path) == before


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_run_s_tensorboard_directory_must_be_its_own(tmp_path, planted):
    """The run's event-file directory is refused, untouched, when it is a link or a file."""
    run = recorded_run(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if planted == "link":
        (run / "tensorboard").symlink_to(outside, target_is_directory=True)
    else:
        (run / "tensorboard").write_text("mine")
    before = _digest(tmp_path)
    code, out, err = main_in_process(["train", "--steps", "6", *RECORDED_ARGS, "--output", str(run)])
    what = "a symbolic link" if planted == "link" else "a file"
    assert code == 2 and f"tensorboard is {what}" in _one_line(err), err
    assert _digest(tmp_path) == before


def test_a_run_directory_whose_record_is_a_directory_is_refused(tmp_path):
    run = recorded_run(tmp_path)
    (run / "steps.csv").unlink()
    (run / "steps.csv").mkdir()
    code, out, err = main_in_process(["train", "--steps", "6", *RECORDED_ARGS, "--output", str(run)])
    assert code == 2 and "steps.csv is not a regular file" in _one_line(err), err


def test_fewer_steps_than_a_run_holds_are_refused(tmp_path):
    run = recorded_run(tmp_path)
    before = _digest(tmp_path)
    code, out, err = main_in_process(["train", "--steps", "2", *RECORDED_ARGS, "--output", str(run)])
    assert code == 2 and "--steps 2 is fewer than the 4 steps" in _one_line(err), err
    assert _digest(tmp_path) == before


def test_a_locked_run_directory_refuses_a_second_writer_and_changes_nothing(tmp_path):
    run = recorded_run(tmp_path)
    with files.directory_lock(run):
        before = _digest(tmp_path)
        proc = _cli("train", "--steps", "6", *RECORDED_ARGS, "--output", str(run))
        assert proc.returncode == 2 and f"is in use by another convprobe run (pid {os.getpid()})" in \
            _one_line(proc.stderr), proc.stderr
        assert _digest(tmp_path) == before


def test_a_refused_run_leaves_no_lock_and_no_directory_it_created(tmp_path):
    target = tmp_path / "new" / "run"
    with pytest.raises(InvalidArgument, match="refused inside"):
        with files.directory_lock(target):
            assert (target / files.LOCK_NAME).is_file()
            raise InvalidArgument("refused inside the lock")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.tensorflow
def test_two_train_processes_on_one_directory_one_runs_the_other_is_refused(tmp_path):
    run = tmp_path / "run"
    args = ["train", "--steps", "8", "--resnet-size", "8", "--image-size", "8", "--batch-size", "4", "--no-jit",
            "--record-every", "4", "--output", str(run)]
    first = subprocess.Popen([sys.executable, "-m", "convprobe", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    deadline = time.monotonic() + 120
    while not (run / files.LOCK_NAME).exists() or not (run / files.LOCK_NAME).read_text():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = _cli(*args)
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert second.returncode == 2 and "is in use by another convprobe run" in _one_line(second.stderr)
    steps = [line.split(",")[0] for line in (run / "steps.csv").read_text().splitlines()[1:]]
    assert steps == [str(s) for s in range(8)]  # every step recorded once


@pytest.mark.tensorflow
def test_a_file_size_limit_during_training_is_one_line_exit_3_and_the_run_resumes(tmp_path):
    run = tmp_path / "run"
    args = ["train", *TINY_RUN, "--checkpoint-every", "1", "--output", str(run)]
    limited = _cli(*args, limit_file_size=100_000)  # the checkpoint is ~0.6 MB
    assert limited.returncode == 3 and "could not write" in _one_line(limited.stderr), limited.stderr
    assert not (run / "checkpoint.npz").exists() and not [p for p in run.iterdir()
                                                          if p.name.startswith(files.TEMPORARY_PREFIX)]
    resumed = _cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "2/2 steps" in resumed.stdout and (run / "checkpoint.npz").is_file()


@pytest.mark.tensorflow
def test_links_planted_at_the_old_fixed_temporary_names_are_never_written_through(tmp_path):
    """The checkpoint and the CSV rewrites once went through fixed temporary names
    (checkpoint.tmp.npz, steps.tmp); a link planted there, beside a recorded run, stays a
    link and its target stays as it was, through a resume that checkpoints every step."""
    run = tmp_path / "run"
    shape = TINY_RUN[2:]  # without --steps
    args = ["train", *shape, "--checkpoint-every", "1", "--output", str(run)]
    assert _cli(*args, "--steps", "2").returncode == 0
    outside = _outside(tmp_path)
    for name in ("checkpoint.tmp.npz", "steps.tmp", "telemetry.tmp"):
        (run / name).symlink_to(outside)
    resumed = _cli(*args, "--steps", "4")
    assert resumed.returncode == 0, resumed.stderr
    assert "4/4 steps" in resumed.stdout
    assert outside.read_text() == "the user's own file"
    assert all((run / name).is_symlink() for name in ("checkpoint.tmp.npz", "steps.tmp", "telemetry.tmp"))


def test_a_full_standard_output_is_one_line_exit_3_and_the_output_file_is_complete(tmp_path):
    """--output is written before anything is printed, so a terminal or file that fails
    afterwards (here /dev/full: no space left) cannot lose the record."""
    target = tmp_path / "kept.json"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "convprobe", *EMULATED, "--output", str(target)], cwd=REPO,
                              stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE, text=True, timeout=600)
    assert proc.returncode == 3 and "could not write to standard output" in _one_line(proc.stderr), proc.stderr
    assert results.read(target, kinds=("overflow",))["results"]


@pytest.mark.parametrize("plant", ["link", "user files"])
def test_a_comparison_refuses_a_bad_run_directory_before_any_run_trains(tmp_path, plant):
    """Every run of --compare-loss-scaling is checked before the first trains: a run directory
    that is a link to a user's directory, or holds a user's files, is refused untouched."""
    user = _user_directory(tmp_path)
    comparison = tmp_path / "cmp"
    comparison.mkdir()
    if plant == "link":
        (comparison / "fp16-dynamic_seed0").symlink_to(user)
    else:
        (comparison / "fp16-dynamic_seed0").mkdir()
        (comparison / "fp16-dynamic_seed0" / "notes.txt").write_text("mine")
        (comparison / "fp16-none_seed0").mkdir()
        (comparison / "fp16-none_seed0" / "header.json").write_text("{}")  # a comparison that looks recorded
    before = _digest(tmp_path)
    code, out, err = main_in_process(["train", *TINY_RUN, "--compare-loss-scaling", "--output", str(comparison)])
    said = _one_line(err)
    assert code == 2 and ("fp16-dynamic_seed0 is a symbolic link" in said if plant == "link"
                          else "fp16-none_seed0/header.json" in said), err
    assert _digest(tmp_path) == before
