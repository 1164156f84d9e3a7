"""The training twin and GPU counterfactuals: writes docs/training-twin.md.

    python experiments/training_twin/run.py [--config config.json] [--output DIR] [--page docs/training-twin.md]

Twin: for each row of the config, ``convprobe train --config C --no-jit ...`` runs natively and
again with ``--arithmetic twin`` (identify measures the run's layers in C first), each its
own process; the page lists whether the losses in steps.csv and the weights' SHA-256 in
summary.json are equal, bit for bit, and how many conv ops ran in the emulator.

Counterfactual: the same training (one seed, no XLA in every run, so only the conv
arithmetic differs) natively and under each GPU preset or model, with telemetry; the page
lists final loss, evaluation accuracy, skipped steps and the gradient underflow the
telemetry measured (flushed or lost against the fp32 shadow, mean over recorded steps and
tensors, and the largest). Rerunning reuses finished runs. Not run in CI.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from convprobe import experiment, provenance

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def train(args: list[str], output: Path) -> tuple[dict, float]:
    """Run `convprobe train ARGS --output OUTPUT` in a child; (summary, wall seconds)."""
    start = time.perf_counter()
    argv = [sys.executable, "-m", "convprobe", "train", *args, "--output", str(output)]
    run = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if run.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(argv)}\n{run.stderr[-2000:]}")
    summary = json.loads((output / "summary.json").read_text())["summary"]
    return summary, time.perf_counter() - start


def column(path: Path, name: str) -> list[str]:
    with open(path, newline="") as handle:
        return [row[name] for row in csv.DictReader(handle)]


def twin_rows(config: dict, output: Path) -> list[str]:
    rows = ["| configuration | ResNet | image | batch | steps | conv ops emulated | losses equal | weights SHA-256 equal | native s | twin s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for case in config["twin"]:
        args = ["--config", case["config"], "--no-jit", "--steps", str(case["steps"]), "--resnet-size",
                str(case["resnet_size"]), "--image-size", str(case["image_size"]), "--batch-size",
                str(case["batch_size"]), "--record-every", "1"]
        name = f"{case['config']}_r{case['resnet_size']}_i{case['image_size']}"
        native, native_s = train(args, output / f"{name}_native")
        twin, twin_s = train([*args, "--arithmetic", "twin"], output / f"{name}_twin")
        header = json.loads((output / f"{name}_twin" / "header.json").read_text())["arithmetic"]
        ops = header["emulated_ops"] + header["tensorflow_ops"]
        equal = column(output / f"{name}_native" / "steps.csv", "loss") == column(output / f"{name}_twin" / "steps.csv", "loss")
        same = native["weights_sha256"] == twin["weights_sha256"]
        untested = "" if header["emulated_ops"] else " (nothing emulated: not a test)"
        rows.append(f"| {case['config']} | {case['resnet_size']} | {case['image_size']} | {case['batch_size']} | "
                    f"{case['steps']} | {header['emulated_ops']} of {ops} | {'yes' if equal else 'NO'}{untested} | "
                    f"{'yes' if same else 'NO'}{untested} | {native_s:.0f} | {twin_s:.0f} |")
        print(rows[-1], flush=True)
    return rows


def underflow(path: Path) -> tuple[float, float, float]:
    """(mean, max) of flushed-or-lost fractions over recorded steps and tensors, and the mean
    subnormal fraction, over activation and fp16 weight gradients."""
    with open(path, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["precision"] != "fp32"]
    values = [float(r["underflow_fraction"]) for r in rows]
    subnormal = [float(r["subnormal_fraction"]) for r in rows]
    return sum(values) / len(values), max(values), sum(subnormal) / len(subnormal)


def counterfactual_rows(config: dict, output: Path) -> list[str]:
    plan = config["counterfactual"]
    rows = ["| arithmetic of every conv op | step-0 loss | final loss | eval accuracy | skipped steps | underflow mean | "
            "underflow max | subnormal mean | s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for arithmetic in plan["arithmetics"]:
        directory = output / ("cf_" + arithmetic.replace(":", "_").replace("=", "-"))
        summary, seconds = train([*plan["args"], "--arithmetic", arithmetic], directory)
        mean, worst, subnormal = underflow(directory / "telemetry.csv")
        first = float(column(directory / "steps.csv", "loss")[0])
        rows.append(f"| `{arithmetic}` | {first:.7f} | {summary['final_loss']:.4f} | {summary['eval_accuracy']:.4f} | "
                    f"{summary['skipped_steps']} | {mean:.3e} | {worst:.3e} | {subnormal:.3e} | {seconds:.0f} |")
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    parser = experiment.parser(__doc__, HERE)
    parser.add_argument("--page", default=str(ROOT / "docs" / "training-twin.md"))
    args = parser.parse_args(argv)
    config, output = experiment.load(args)
    output.mkdir(parents=True, exist_ok=True)
    record = provenance.collect()
    twin = twin_rows(config, output)
    counterfactual = counterfactual_rows(config, output)
    common = shlex.join(["convprobe", "train", *config["counterfactual"]["args"]])
    page = [
        "# The training twin and GPU counterfactuals",
        "",
        f"Generated by `python experiments/training_twin/run.py` ({HERE.name}/config.json); do not edit by hand.",
        "",
        *experiment.provenance_lines(record),
        "",
        "## The twin reproduces TensorFlow's training bit for bit",
        "",
        "Each row: `convprobe train --config C --no-jit --steps S --resnet-size R --image-size I --batch-size B "
        "--record-every 1`, then the same with `--arithmetic twin`. The twin computes every conv op identify found "
        "a model for in the emulator (a conv op without one runs TensorFlow's kernel, and the header says so); "
        "batch norm, the dense layer, the loss and the optimizer are TensorFlow's in both. Equal losses in "
        "steps.csv (written at full precision) and equal SHA-256 of the final fp32 weights mean the whole "
        "training computed the same bits.",
        "",
        *twin,
        "",
        "## What another arithmetic does to the same training",
        "",
        f"`{common} --arithmetic A` for each A. No XLA in any run, so only the conv arithmetic differs "
        "from the native row. GPU presets model the tensor core's MMA instruction chained along K, not "
        "cuDNN's choice of algorithm per layer. Underflow: the share of fp16 gradient values (activation "
        "gradients and conv/dense weight gradients) flushed to zero or lost against the fp32 shadow, over "
        "every recorded step. The step-0 loss is computed from the same weights and batch in every run, so its "
        "difference from the native row is the conv arithmetic's alone; after that the runs part. One seed: "
        "differences in final loss and accuracy of this size are within the spread between seeds "
        "([accuracy-parity.md](accuracy-parity.md) has three seeds per arm).",
        "",
        *counterfactual,
        "",
    ]
    return experiment.write_page(args.page, page)


if __name__ == "__main__":
    raise SystemExit(main())
