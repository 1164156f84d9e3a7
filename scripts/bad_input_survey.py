"""Survey: what convprobe does with bad input and special files, case by case, as a user sees it.

Each case runs as its own process in a fresh temporary directory (a FIFO or a device must not
block this script) and is classed by what came back:

- clean: exit 2 (or the expected exception in a Python case), one line, no traceback, the
  expected words (what was wrong, in the user's terms) in it, and the check's own condition
  (e.g. nothing written) holding;
- unclear: refused cleanly, but without the expected words;
- dirty: a traceback, several lines, another exit code, or the check's condition broken;
- ignored: exit 0, the bad input taken as something else;
- hang: no answer within the time limit (20 s; a well-behaved refusal takes about 1 s): it
  blocked, or it ran something instead of refusing.

Run it on this checkout, or on another (an older commit's worktree) to compare:

    python scripts/bad_input_survey.py [--repo PATH] [--timeout 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: A comparison document, written in the case's directory by `_COMPARISON`, then damaged.
_COMPARISON = r"""
import json, sys
from convprobe import provenance, results
rows = [{"arm": a, "seed": s, "directory": f"{a.replace('/', '-')}_seed{s}", "status": "ok", "error": None,
         "reused": False, "jit": True, "eval_accuracy": 0.5, "final_loss": 1.0, "skipped_steps": 0,
         "nonfinite_steps": 0, "final_step": 2, "underflow": None, "seconds": 1.0}
        for a in ("fp32", "fp16/128") for s in (0, 1)]
arms = [{"arm": a, "runs": 2, "finished": 2, "eval_accuracy_mean": 0.5, "eval_accuracy_std": 0.0,
         "final_loss_mean": 1.0, "final_loss_std": 0.0, "skipped_steps": 0} for a in ("fp32", "fp16/128")]
document = results.envelope("train-comparison", {"arms": ["fp32", "fp16/128"], "seeds": [0, 1], "shared": {}},
                            provenance.collect(), runs=rows, arms=arms, notes={})
damage = sys.argv[1]
if damage == "twice":
    document["runs"].append(dict(rows[0])); document["arms"][0]["runs"] = 3; document["arms"][0]["finished"] = 3
elif damage == "missing":
    del document["runs"][1]
elif damage == "outside":
    document["runs"][0]["directory"] = "../../elsewhere_seed0"
elif damage == "kind":
    document["kind"] = "train"
import pathlib
pathlib.Path("cmp").mkdir()
pathlib.Path("cmp/comparison.json").write_text(json.dumps(document))
"""

_CALLBACK_MODEL = r"""
import numpy as np, keras
from convprobe import files
from convprobe.training import UnderflowTelemetry
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.GlobalAveragePooling2D(),
                          keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
xs, ys = np.random.default_rng(0).normal(size=(16, 8, 8, 3)).astype("float32"), np.arange(16) % 10
"""


@dataclass
class Case:
    """One bad input: its category, what it is, the command (a convprobe command line, or
    Python code after `python -c`), the words a clean answer holds, and how to set it up."""

    category: str
    what: str
    argv: list[str]
    expect: str | tuple[str, ...]  # words a clean answer holds: any one of them
    setup: str = ""  # shell run in the case's directory first
    python: bool = False
    check: str = ""  # shell run after: must exit 0 for the case to be clean
    exit_code: int = 2
    extra: dict = field(default_factory=dict)


def _cases() -> list[Case]:
    special = "Special files and empty values"
    ignored = "Options silently ignored"
    documents = "Documents inconsistent with themselves"
    callback = "The callback's lifecycle"
    messages = "Messages that name internals or the wrong thing"
    model = "m.keras"
    return [
        Case(special, "a FIFO as --keras-model", ["identify", "--keras-model", model], "is not a regular file",
             setup=f"mkfifo {model}"),
        Case(special, "a link to /dev/zero as --keras-model", ["identify", "--keras-model", model],
             "is not a regular file", setup=f"ln -s /dev/zero {model}"),
        Case(special, "an empty file as --keras-model", ["identify", "--keras-model", model], "is empty",
             setup=f": > {model}"),
        Case(special, "a text file as --keras-model", ["identify", "--keras-model", model],
             "is not a saved Keras model", setup=f"echo hello > {model}"),
        Case(special, "a directory as --keras-model", ["identify", "--keras-model", model], "is a directory",
             setup=f"mkdir {model}"),
        Case(special, "--keras-model ''", ["identify", "--keras-model", ""], "empty value"),
        Case(special, "--arithmetic ''", ["train", "--arithmetic", "", "--output", "/proc/nope"], "empty value"),
        Case(special, "--arithmetic-map ''", ["train", "--arithmetic", "twin", "--arithmetic-map", ""], "empty value"),
        Case(special, "--output ''", ["overflow", "--output", ""], ("empty value", "received ''")),
        Case(special, "report ''", ["report", ""], ("empty value", "received ''")),
        Case(special, "a FIFO as --arithmetic-map", ["train", "--arithmetic", "twin", "--arithmetic-map", "m.json",
                                                     "--output", "run"], "is not a regular file", setup="mkfifo m.json"),
        Case(special, "a FIFO as a CIFAR-10 file", ["train", "--data", "cifar10", "--data-dir", "d", "--output", "run"],
             "is not a regular file", setup="mkdir d && mkfifo d/data_batch_1.bin"),
        Case(special, "a FIFO as an experiment's --config",
             [str(HERE / "experiments" / "classic_question" / "run.py"), "--config", "c.json"], "is not a regular file",
             setup="mkfifo c.json", python=True),
        Case(ignored, "--compare-loss-scaling --loss-scale none",
             ["train", "--compare-loss-scaling", "--loss-scale", "none", "--output", "cmp"], "static arm's scale"),
        Case(ignored, "a spec giving out twice",
             ["overflow", "--backend", "emulated", "--model", "sequential:fp16:out=fp16:out=fp32"], "twice"),
        Case(ignored, "a GPU preset giving in twice",
             ["overflow", "--backend", "emulated", "--model", "a100:in=bf16:in=fp16"], "twice"),
        Case(ignored, "an --arithmetic-map with a key twice",
             ["train", "--arithmetic", "twin", "--arithmetic-map", "m.json", "--output", "run"], "twice",
             setup="""printf '{"schema_version": 2, "kind": "identify", "kind": "identify"}' > m.json"""),
        Case(ignored, "lam with the deterministic bound",
             ["-c", "import numpy as np; from convprobe.testing import assert_within_error_bound as a; "
                    "a(np.ones(2, np.float32), np.ones(2), 16, lam=1e9)"], "lam applies to kind='probabilistic'",
             python=True, exit_code=1),
        Case(documents, "report: a run listed twice", ["report", "cmp", "--out-dir", "fig"], "runs[4]",
             setup="python3 -c \"$COMPARISON\" twice", check="test ! -e fig"),
        Case(documents, "report: a run missing that the arms count", ["report", "cmp", "--out-dir", "fig"],
             "one row for each arm at each seed", setup="python3 -c \"$COMPARISON\" missing", check="test ! -e fig"),
        Case(documents, "report: a run directory outside the comparison", ["report", "cmp", "--out-dir", "fig"],
             "inside the comparison", setup="python3 -c \"$COMPARISON\" outside", check="test ! -e fig"),
        Case(callback, "two callbacks on one directory",
             ["-c", _CALLBACK_MODEL + "model.fit(xs, ys, verbose=0, callbacks=[UnderflowTelemetry('d'), "
                                      "UnderflowTelemetry('d')])"],
             "two UnderflowTelemetry callbacks", python=True, exit_code=1, check="test ! -e d"),
        Case(callback, "Ctrl-C in a fit, then a plain fit",
             ["-c", _CALLBACK_MODEL + "class Stop(keras.callbacks.Callback):\n"
                                      "    def on_train_batch_end(self, batch, logs=None): raise KeyboardInterrupt\n"
                                      "try:\n    model.fit(xs, ys, batch_size=4, verbose=0, "
                                      "callbacks=[UnderflowTelemetry('d', every=1), Stop()])\n"
                                      "except KeyboardInterrupt:\n    pass\n"
                                      "model.fit(xs, ys, batch_size=4, verbose=0)\n"
                                      "assert 'train_step' not in model.__dict__, 'the wrapper stayed'\n"
                                      "assert files.lock_holder('d') is None, 'the lock stayed'\n"
                                      "raise SystemExit(2)"],
             "", python=True),
        Case(messages, "'all' among --op names", ["fingerprint", "--op", "conv2d,all"], "stands alone"),
        Case(messages, "report: comparison.json of kind train", ["report", "cmp", "--out-dir", "fig"],
             "expected 'train-comparison'", setup="python3 -c \"$COMPARISON\" kind"),
        Case(messages, "a train header as --arithmetic-map",
             ["train", "--arithmetic", "twin", "--arithmetic-map", "cmp/comparison.json", "--output", "run"],
             "expected 'identify'", setup="python3 -c \"$COMPARISON\" none"),
        Case(messages, "a NaN reference for the error bound",
             ["-c", "import numpy as np; from convprobe.testing import assert_within_error_bound as a; "
                    "a(np.array([1.0, 2.0]), np.array([np.nan, 2.0]), 16)"], "reference must be finite",
             python=True, exit_code=1),
    ]


def _run(case: Case, repo: Path, timeout: float) -> tuple[str, str, float]:
    """(class, the answer's last line, seconds)."""
    with tempfile.TemporaryDirectory(prefix="convprobe-survey-") as where:
        env = {**os.environ, "PYTHONPATH": str(repo), "TF_CPP_MIN_LOG_LEVEL": "3", "COMPARISON": _COMPARISON}
        if case.setup:
            subprocess.run(["bash", "-c", case.setup], cwd=where, env=env, check=True, timeout=120)
        command = [sys.executable, *case.argv] if case.python else [sys.executable, "-m", "convprobe", *case.argv]
        began = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return "hang", f"(no answer in {timeout:g} s: blocked, or running)", time.perf_counter() - began
        seconds = time.perf_counter() - began
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(("W0", "I0", "E0"))]
        last = lines[-1] if lines else "(nothing on stderr)"
        held = not case.check or subprocess.run(["bash", "-c", case.check], cwd=where).returncode == 0
        if proc.returncode == 0:
            return "ignored", last, seconds
        if "Traceback" in proc.stderr and not case.python:
            return "dirty", last, seconds
        if proc.returncode != case.exit_code or not held or (not case.python and len(lines) != 1):
            return "dirty", last, seconds
        expected = (case.expect,) if isinstance(case.expect, str) else case.expect
        return ("clean" if any(words in last for words in expected) else "unclear"), last, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE, help="the checkout to survey (default: this one)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as a hang")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = parser.parse_args(argv)
    counts: dict[str, dict[str, int]] = {}
    for case in _cases():
        verdict, last, seconds = _run(case, args.repo.resolve(), args.timeout)
        counts.setdefault(case.category, {}).setdefault(verdict, 0)
        counts[case.category][verdict] += 1
        if args.json:
            print(json.dumps({"category": case.category, "case": case.what, "verdict": verdict, "seconds": seconds,
                              "answer": last}))
        else:
            print(f"{verdict:<8} {seconds:5.1f} s  {case.category}: {case.what}\n                   {last[:160]}")
    print()
    for category, verdicts in counts.items():
        print(f"{category}: " + ", ".join(f"{n} {verdict}" for verdict, n in sorted(verdicts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
