"""Training comparisons: every (arm, seed) a run of its own, one `train-comparison` document.

`convprobe train --arm ARM ... --seeds 0,1,2 --output DIR` (`run_arms`) runs each arm
(`convprobe.training.arms`: dtype, loss scale, arithmetic) at each seed as its own child
process, ``python -m convprobe train`` with the arm's options and the shared ones, into
``DIR/<arm name>_seed<k>/``; the child's output goes to ``DIR/<arm name>_seed<k>.log``.
The same seed gives the same initial weights and the same batches in every arm. Arms
differ in their dtype, loss scale and conv arithmetic, and also in XLA: a native arm runs
with XLA by default, an emulated one (``@ARITHMETIC``) cannot; each row records its jit. Every run and its directory is checked before the first one
starts. A run that fails or crashes is a row with its status and the last line of its
output, never a lost comparison; rerunning the command reuses finished runs and resumes
interrupted ones (as `convprobe train` does on its own directory).

`DIR/comparison.json` (kind `train-comparison`, `convprobe.results`) holds per run the
final evaluation accuracy, the final training loss, skipped steps, jit, status and an
underflow summary (`underflow_summary`), and per arm the mean and the sample standard
deviation (ddof = 1) over its finished runs; `DIR/comparison.txt` the same as text.
`--compare-loss-scaling` is the arms DTYPE/none, DTYPE/S, DTYPE/dynamic
(`arms.loss_scaling_arms`). Beside the accuracy, `summarise` reduces the runs' telemetry
to one per-layer table (`underflow.csv`, `underflow.txt`) and `plot_comparison` draws
underflow per layer, the magnitude histogram of the fp32 shadow gradients with the
format's representable range marked, and the loss-scale trajectory.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from convprobe import children, files, provenance, results
from convprobe.errors import InvalidArgument
from convprobe.formats import parse_format
from convprobe.options import Status
from convprobe.training.arms import Arm, loss_scaling_arms
from convprobe.training.config import LossScaleMode, TrainConfig
from convprobe.training.records import RunFiles, claim_directory, read_header, read_summary
from convprobe.training.telemetry import decode_histogram

__all__ = ["COMPARISON_NAME", "PlannedRun", "plan_arms", "run_arms", "child_arguments", "underflow_summary",
           "arm_statistics", "format_comparison", "run_comparison", "summarise", "overview", "plot_comparison",
           "format_table"]

COMPARISON_NAME = results.COMPARISON_FILE
#: What a comparison writes at its top level, beside one run directory (and its .log) per run.
COMPARISON_FILES = (COMPARISON_NAME, "comparison.txt", "underflow.csv", "underflow.txt", "underflow_per_layer.png",
                    "gradient_histogram.png", "scale_trajectory.png")

#: What a comparison's lock file says holds it (`files.directory_lock`).
COMPARISON_HOLDER = "convprobe comparison"

FRACTIONS = ("flushed_fraction", "subnormal_fraction", "routing_zero_fraction", "lost_fraction",
             "underflow_fraction", "shadow_underflow_fraction")

#: What the statistics per arm are (written into comparison.json).
STATISTICS_NOTE = ("per arm, over its finished runs: mean and sample standard deviation (ddof = 1; null with "
                   "fewer than 2 runs) of the final evaluation accuracy and of the final training loss")
UNDERFLOW_NOTE = ("underflow = share of a gradient tensor's elements that are zero in the low-precision "
                  "backward pass while their fp32 shadow (same weights, same batch) is not (flushed or lost; "
                  "telemetry.csv's underflow_fraction). At the run's last recorded telemetry step, over the "
                  "tensors computed in the compute dtype, each gradient counted once: weight_mean and "
                  "activation_mean are the means over weight and activation gradients, worst the largest "
                  "share of any one tensor (worst_tensor)")
LOSS_NOTE = ("final_loss: the training loss of the last step (the ResNet's: mean cross-entropy of the batch; a "
             "user's model's: its compiled loss)")

#: TrainConfig fields without a command-line option: an arm's child runs them at their default.
_NO_FLAG = ("synthetic_noise", "weight_decay", "momentum")


@dataclass(frozen=True)
class PlannedRun:
    """One (arm, seed) run: its validated configuration and directory name."""

    arm: Arm
    seed: int
    config: TrainConfig

    @property
    def name(self) -> str:
        return self.arm.run_name(self.seed)


def _number(value: float) -> str:
    """A float as text that reads back to the same float."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def child_arguments(config: TrainConfig) -> list[str]:
    """`convprobe train` arguments that validate into `config` (progress off): every setting
    spelled out, jit included, so the child runs exactly the run planned here."""
    spec = config.loss_scale
    scale = spec.mode.value if spec.mode in (LossScaleMode.NONE, LossScaleMode.DYNAMIC) else _number(spec.scale)
    argv = ["train", "--dtype", config.dtype, "--loss-scale", scale, "--steps", str(config.steps),
            "--record-every", str(config.record_every), "--batch-size", str(config.batch_size),
            "--seed", str(config.seed), "--data", config.data, "--output", str(config.output),
            "--jit" if config.jit else "--no-jit", "--distribute", config.distribute,
            "--eval-batches", str(config.eval_batches), "--checkpoint-every", str(config.checkpoint_every),
            "--arithmetic", config.arithmetic.text, "--no-progress"]
    if config.keras_model is not None:  # the user's model: its shapes and optimizer are its own
        argv += ["--keras-model", config.keras_model]
    else:
        assert config.learning_rate is not None and config.bn_momentum is not None, "a ResNet run's (validate_config)"
        argv += ["--resnet-size", str(config.resnet_size), "--image-size", str(config.image_size),
                 "--learning-rate", _number(config.learning_rate), "--bn-momentum", _number(config.bn_momentum)]
    if spec.mode is LossScaleMode.STATIC_NO_SKIP:
        argv.append("--no-skip")
    if spec.mode is LossScaleMode.DYNAMIC:
        argv += ["--dynamic-growth-steps", str(config.dynamic_growth_steps)]
    if config.distribute == "mirrored":
        argv += ["--devices", str(config.logical_devices)]
    if config.data_dir is not None:
        argv += ["--data-dir", str(config.data_dir)]
    if config.arithmetic_map is not None:
        argv += ["--arithmetic-map", str(config.arithmetic_map)]
    if config.configuration is not None:
        argv += ["--config", config.configuration]
    return argv


def plan_arms(base: TrainConfig, arms: list[Arm], seeds: list[int], output: str | Path, *,
              jit: bool | None = None, skip: bool = True, arithmetic_map: str | None = None) -> list[PlannedRun]:
    """Every (arm, seed) run validated and its directory checked, changing nothing: a bad arm,
    a foreign or inconsistent run directory is one InvalidArgument line before any run starts."""
    defaults = TrainConfig()
    for name in _NO_FLAG:
        if getattr(base, name) != getattr(defaults, name) and not (base.keras_model and getattr(base, name) is None):
            raise InvalidArgument(f"{name} has no command-line option, and every arm runs as `convprobe train` "
                                  f"in a child process: keep its default ({getattr(defaults, name)!r}); received "
                                  f"{getattr(base, name)!r}")
    if base.distribute == "multi-worker":
        raise InvalidArgument("--arm and --compare-loss-scaling run each arm in one process; they cannot be "
                              "combined with --distribute multi-worker")
    output = Path(output)
    planned = [PlannedRun(arm, seed, arm.config(base, seed=seed, output=str(output / arm.run_name(seed)),
                                                jit=jit, skip=skip, arithmetic_map=arithmetic_map))
               for arm in arms for seed in seeds]
    if arithmetic_map is not None and not any(run.config.arithmetic_map for run in planned):
        raise InvalidArgument("--arithmetic-map is read only by an arm with @twin; received it with arms "
                              + ", ".join(arm.label for arm in arms))
    names = [run.name for run in planned]
    files.refuse_locked(output)  # a second writer is told who holds the comparison, before anything else
    document = output / COMPARISON_NAME
    if document.is_file() and not document.is_symlink():
        results.read(document, kinds=(results.Kind.TRAIN_COMPARISON,))  # a user's own file is refused
    # convprobe's own once its lock is there: a comparison killed before any run wrote a header is resumed
    recorded = document.is_file() or files.has_lock_file(output) or any(
        (output / name / "header.json").is_file() for name in names)
    claim_directory(output, (*COMPARISON_FILES, *(f"{name}.log" for name in names)), own_directories=names,
                    what="a convprobe comparison", recorded=recorded)
    for run in planned:
        RunFiles(_directory(run.config)).plan(run.config.to_json())
    return planned


def _directory(config: TrainConfig) -> str:
    """A planned run's directory (`plan` gives every run one inside the comparison's)."""
    assert config.output is not None
    return config.output


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError as error:
        return f"(its output could not be read: {results.reason(error)})"
    lines = [line for line in lines if line]
    return lines[-1][:500] if lines else "(no output)"


def _finished(config: TrainConfig) -> bool:
    files_ = RunFiles(_directory(config))
    if not files_.summary_path.is_file():
        return False
    try:
        summary = read_summary(_directory(config))
    except InvalidArgument:
        return False
    evaluated = read_header(_directory(config))["params"].get("eval_batches", 0)
    return bool(summary["finished"]) and summary["final_step"] >= config.steps and evaluated == config.eval_batches


def _execute(run: PlannedRun, log: Path) -> tuple[Status, str | None, float]:
    """Run one planned run in a child process; its status, the last line of its output when it
    did not succeed, and its wall time."""
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    began = time.perf_counter()
    with files.open_append(log) as handle:
        handle.write(f"$ convprobe {' '.join(child_arguments(run.config))}\n")
        handle.flush()
        process = children.run("convprobe", child_arguments(run.config), env=environment,
                               stdin=subprocess.DEVNULL, stdout=handle, stderr=handle)
    seconds = time.perf_counter() - began
    if process.returncode == 0 and _finished(run.config):
        return Status.OK, None, seconds
    status = Status.CRASHED if process.returncode < 0 else Status.FAILED
    return status, f"exit status {process.returncode}: {_last_line(log)}", seconds


def underflow_summary(directory: str | Path) -> dict | None:
    """The run's underflow at its last recorded telemetry step (`UNDERFLOW_NOTE`); None
    without telemetry."""
    path = Path(directory) / "telemetry.csv"
    if not path.is_file():
        return None
    t = pd.read_csv(path, keep_default_na=False, dtype={"same_gradient_as": str})
    if t.empty:
        return None
    last = t[t["step"] == t["step"].max()]
    compute = last.loc[last["kind"] == "activation", "precision"]
    counted = last[(last["same_gradient_as"] == "")
                   & ((last["precision"] == compute.iloc[0]) if len(compute) else True)]
    worst = counted.loc[counted["underflow_fraction"].idxmax()]

    def mean(kind: str) -> float | None:
        part = counted.loc[counted["kind"] == kind, "underflow_fraction"]
        return float(part.mean()) if len(part) else None

    return {"step": int(last["step"].iloc[0]), "weight_mean": mean("weight"), "activation_mean": mean("activation"),
            "worst": float(worst["underflow_fraction"]), "worst_tensor": f"{worst['kind']} {worst['layer']}",
            "tensors": int(len(counted))}


def _row(run: PlannedRun, status: Status, error: str | None, seconds: float | None, reused: bool) -> dict:
    row = {"arm": run.arm.label, "seed": run.seed, "directory": run.name, "status": str(status), "error": error,
           "reused": reused, "dtype": run.arm.dtype, "loss_scale": run.arm.scale_text,
           "arithmetic": run.arm.arithmetic.text, "jit": run.config.jit, "eval_accuracy": None, "final_loss": None,
           "skipped_steps": None, "nonfinite_steps": None, "final_step": None, "final_loss_scale": None,
           "underflow": None, "seconds": seconds,
           "command": "convprobe " + " ".join(child_arguments(run.config))}
    if status == Status.OK:
        summary = read_summary(_directory(run.config))
        row.update(eval_accuracy=summary["eval_accuracy"], final_loss=summary["final_loss"],
                   skipped_steps=summary["skipped_steps"], nonfinite_steps=summary["nonfinite_steps"],
                   final_step=summary["final_step"], final_loss_scale=summary["final_loss_scale"],
                   jit=summary["jit"], underflow=underflow_summary(_directory(run.config)))
    return row


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def arm_statistics(rows: list[dict], arms: list[str]) -> list[dict]:
    """Per arm: runs, finished runs, mean and sample std (ddof = 1) of eval accuracy and final
    loss over the finished runs, skipped steps in all, mean underflow (`UNDERFLOW_NOTE`)."""
    table = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        ok = [r for r in mine if r["status"] == Status.OK]
        accuracy, accuracy_std = _mean_std([r["eval_accuracy"] for r in ok])
        loss, loss_std = _mean_std([r["final_loss"] for r in ok])
        flows = [r["underflow"] for r in ok if r["underflow"] is not None]
        table.append({
            "arm": arm, "runs": len(mine), "finished": len(ok),
            "eval_accuracy_mean": accuracy, "eval_accuracy_std": accuracy_std,
            "final_loss_mean": loss, "final_loss_std": loss_std,
            "skipped_steps": sum(r["skipped_steps"] for r in ok),
            "underflow_activation_mean": _mean_std([f["activation_mean"] for f in flows])[0],
            "underflow_weight_mean": _mean_std([f["weight_mean"] for f in flows])[0],
            "underflow_worst": max((f["worst"] for f in flows), default=None),
        })
    return table


def _percent(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "") + " %"


def format_comparison(document: dict) -> str:
    """The comparison as text: mean ± std per arm, then one line per run."""
    lines = [f"{'arm':<28} {'runs':>5}  {'eval accuracy, mean ± std':>26}  {'final loss':>18}  {'skipped':>7}  "
             f"{'underflow act/weight (worst)':>30}"]
    for a in document["arms"]:
        loss = "-" if a["final_loss_mean"] is None else (
            f"{a['final_loss_mean']:.4f}" + (f" ± {a['final_loss_std']:.4f}" if a["final_loss_std"] is not None else ""))
        flow = "-" if a["underflow_activation_mean"] is None else (
            f"{a['underflow_activation_mean']:.2%}/{a['underflow_weight_mean'] or 0:.2%} ({a['underflow_worst']:.2%})")
        lines.append(f"{a['arm']:<28} {str(a['finished']) + '/' + str(a['runs']):>5}  {_percent(a['eval_accuracy_mean'], a['eval_accuracy_std']):>26}"
                     f"  {loss:>18}  {a['skipped_steps']:>7}  {flow:>30}")
    lines += ["", "std: sample standard deviation (ddof = 1) over the arm's finished runs; underflow: "
                  "mean share of activation/weight gradient elements flushed or lost at the last recorded "
                  "step, worst one tensor", ""]
    lines.append(f"{'run':<40} {'status':<8} {'jit':<5} {'eval acc':>8} {'final loss':>10} {'skipped':>7} {'seconds':>8}")
    for r in document["runs"]:
        accuracy = "-" if r["eval_accuracy"] is None else f"{100 * r['eval_accuracy']:.2f}%"
        loss = "-" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
        seconds = "reused" if r["reused"] else ("-" if r["seconds"] is None else f"{r['seconds']:.0f}")
        lines.append(f"{r['directory']:<40} {r['status']:<8} {str(r['jit']).lower():<5} {accuracy:>8} {loss:>10} "
                     f"{'-' if r['skipped_steps'] is None else r['skipped_steps']:>7} {seconds:>8}")
        if r["error"]:
            lines.append(f"    {r['error']}")
    return "\n".join(lines) + "\n"


def _shared_params(planned: list[PlannedRun]) -> dict:
    """The settings every run shares (the first run's, less what an arm or a seed sets)."""
    params = planned[0].config.to_json()
    for key in ("dtype", "loss_scale", "arithmetic", "seed", "output", "jit", "progress", "arithmetic_map"):
        params.pop(key, None)
    return params


def run_arms(planned: list[PlannedRun], output: str | Path, *, figures: bool = True,
             echo=None) -> dict:
    """Run every planned run not yet finished, each in its own child process, then write
    comparison.json (returned) and comparison.txt; with `figures`, where every arm has one
    dtype, also the per-layer underflow table (underflow.csv, underflow.txt) and figures."""
    output = Path(output)
    echo = echo or (lambda text: print(text, file=sys.stderr, flush=True))
    arms = list(dict.fromkeys(run.arm.label for run in planned))
    seeds = list(dict.fromkeys(run.seed for run in planned))
    rows = []
    with files.directory_lock(output, what=COMPARISON_HOLDER):
        for i, run in enumerate(planned, start=1):
            if _finished(run.config):
                echo(f"[{i}/{len(planned)}] {run.name}: finished before, reused")
                rows.append(_row(run, Status.OK, None, None, reused=True))
                continue
            echo(f"[{i}/{len(planned)}] {run.name}: training ({'XLA' if run.config.jit else 'no XLA'}), "
                 f"output in {run.name}.log")
            status, error, seconds = _execute(run, output / f"{run.name}.log")
            row = _row(run, status, error, seconds, reused=False)
            rows.append(row)
            accuracy = "" if row["eval_accuracy"] is None else f", eval accuracy {row['eval_accuracy']:.4f}"
            echo(f"[{i}/{len(planned)}] {run.name}: {status}{accuracy} ({seconds:.0f} s)"
                 + (f": {error}" if error else ""))
        document = results.envelope(
            results.Kind.TRAIN_COMPARISON,
            {"arms": arms, "seeds": seeds, "shared": _shared_params(planned)},
            provenance.collect(seed=None, device="cpu"),
            runs=rows, arms=arm_statistics(rows, arms),
            notes={"statistics": STATISTICS_NOTE, "underflow": UNDERFLOW_NOTE, "final_loss": LOSS_NOTE},
        )
        results.write(output / COMPARISON_NAME, document)
        files.write_atomic(output / "comparison.txt", format_comparison(document))
        recorded = [r["directory"] for r in rows if r["status"] == Status.OK]
        if figures and recorded and len({r["dtype"] for r in rows}) == 1:  # per layer: one dtype's tensors
            table = summarise(output, recorded)
            files.write_atomic(output / "underflow.csv", table.to_csv(index=False))
            files.write_atomic(output / "underflow.txt", format_table(table))
            plot_comparison(output, recorded)
    return results.read(output / COMPARISON_NAME, kinds=(results.Kind.TRAIN_COMPARISON,))


def run_comparison(config: TrainConfig, output: str | Path, *, static_scale: float | None = None,
                   figures: bool = True, seeds: list[int] | None = None, jit: bool | None = None):
    """`--compare-loss-scaling` as a library call: `config`'s run under the arms DTYPE/none,
    DTYPE/S and DTYPE/dynamic (S `static_scale`, else the dtype's default or 128) at `seeds`
    (default: the config's seed), through `plan_arms` and `run_arms`. Returns the comparison's
    run rows keyed by run directory (output/fp16-none_seed0, fp16-128_seed0, fp16-dynamic_seed0)
    and the per-layer underflow table (`summarise`) of the finished runs."""
    arms = loss_scaling_arms(config.dtype, static_scale, config.arithmetic)
    planned = plan_arms(config, arms, seeds or [config.seed], output, jit=config.jit if jit is None else jit,
                        arithmetic_map=config.arithmetic_map)
    document = run_arms(planned, output, figures=figures)
    runs = {row["directory"]: row for row in document["runs"]}
    finished = [name for name, row in runs.items() if row["status"] == Status.OK]
    return runs, (summarise(output, finished) if finished else None)


def summarise(output: str | Path, labels: list[str]):
    """Long table: scale, kind, index, layer, precision, same_gradient_as, mean fractions over
    the recorded steps."""
    frames = []
    keys = ["kind", "index", "layer", "precision", "same_gradient_as"]
    for label in labels:
        t = pd.read_csv(Path(output) / label / "telemetry.csv", keep_default_na=False,
                        dtype={"same_gradient_as": str})
        g = t.groupby(keys, sort=False)
        agg = g[list(FRACTIONS)].mean()
        agg["recorded_steps"] = g.size()
        agg["max_flushed_fraction"] = g["flushed_fraction"].max()
        agg = agg.reset_index()
        agg.insert(0, "scale", label)
        frames.append(agg)
    return pd.concat(frames, ignore_index=True)


def overview(table):
    """Per kind (activation, weight) and scale, over the tensors that can underflow, each
    gradient counted once: mean and worst-tensor share flushed, mean 'flushed or lost',
    mean subnormal. fp32-only tensors (batch-norm parameters) and taps that repeat another
    tap's gradient are left out; `tensors` says how many were averaged."""
    compute = _compute_precision(table)
    counted = table[(table["same_gradient_as"] == "") & (table["precision"] == compute)]
    rows = []
    for kind in ("activation", "weight"):
        for label in dict.fromkeys(table["scale"]):
            part = counted[(counted["kind"] == kind) & (counted["scale"] == label)]
            rows.append({"gradients": kind, "scale": label, "tensors": len(part),
                         "flushed_mean": part["flushed_fraction"].mean(),
                         "flushed_worst": part["flushed_fraction"].max(),
                         "flushed_or_lost_mean": part["underflow_fraction"].mean(),
                         "subnormal_mean": part["subnormal_fraction"].mean()})
    return pd.DataFrame(rows)


def _compute_precision(table) -> str:
    """The run's compute format: what its activation gradients are computed in."""
    return table.loc[table["kind"] == "activation", "precision"].iloc[0]


def format_table(table) -> str:
    """Per tensor: flushed, flushed-or-lost and subnormal shares for each scale (routing zeros
    apart), then the overview."""
    labels = list(dict.fromkeys(table["scale"]))
    keys = ["kind", "index", "layer", "precision", "same_gradient_as"]
    values = ["flushed_fraction", "underflow_fraction", "subnormal_fraction"]
    pivot = table.pivot_table(index=keys, columns="scale", values=values, sort=False, aggfunc="first")
    routing = table[table["scale"] == labels[0]].set_index(keys)["routing_zero_fraction"]
    compute = _compute_precision(table)
    head = f"{'kind':<10} {'layer':<34} {'routing0':>8} " + " ".join(
        f"{'flush:' + label:>17} {'flush|lost:' + label:>22} {'subn:' + label:>16}" for label in labels)
    lines = [head]
    for key in pivot.index:
        kind, _, layer, precision, same = key
        mark = " (fp32)" if precision != compute else (" (= above)" if same else "")
        cells = " ".join(f"{pivot.loc[key, ('flushed_fraction', label)]:>17.3e} "
                         f"{pivot.loc[key, ('underflow_fraction', label)]:>22.3e} "
                         f"{pivot.loc[key, ('subnormal_fraction', label)]:>16.3e}" for label in labels)
        lines.append(f"{kind:<10} {(layer + mark)[:34]:<34} {routing.loc[key]:>8.3f} {cells}")
    lines += ["", "(fp32): computed in fp32 under mixed precision, cannot flush; (= above): the same gradient "
                  "as an earlier tap, counted once below", ""]
    view = overview(table)
    lines.append(f"{'gradients':<11} {'scale':<12} {'tensors':>7} {'flushed mean':>13} {'flushed worst':>14} "
                 f"{'flushed|lost mean':>18} {'subnormal mean':>15}")
    for r in view.itertuples(index=False):
        lines.append(f"{r.gradients:<11} {r.scale:<12} {r.tensors:>7} {r.flushed_mean:>13.3%} "
                     f"{r.flushed_worst:>14.3%} {r.flushed_or_lost_mean:>18.3%} {r.subnormal_mean:>15.3%}")
    return "\n".join(lines) + "\n"


def plot_comparison(output: str | Path, labels: list[str]) -> list[Path]:
    """Write underflow_per_layer.png, gradient_histogram.png, scale_trajectory.png."""
    output = Path(output)
    paths = []
    table = summarise(output, labels)
    fig = Figure(figsize=(14, 10))
    axes = fig.subplots(2, 1, sharey=False)
    markers = "osD^v"
    for ax, kind in zip(axes, ("weight", "activation")):
        names = []
        for i, label in enumerate(labels):
            part = table[(table["scale"] == label) & (table["kind"] == kind)]
            names = [f"{layer} (fp32)" if p != _compute_precision(table) else layer
                     for layer, p in zip(part["layer"], part["precision"])]
            x = np.arange(len(part)) + (i - (len(labels) - 1) / 2) * 0.12  # offset: equal values stay visible
            ax.plot(x, part["flushed_fraction"], marker=markers[i % len(markers)], ms=4, lw=1,
                    label=f"flushed, {label}")
            ax.plot(x, part["subnormal_fraction"], marker=markers[i % len(markers)], ms=3, ls="--", lw=1,
                    mfc="none", label=f"subnormal, {label}")
        ax.set_xticks(np.arange(len(names)), names, rotation=90, fontsize=6)
        ax.set_title(f"{kind} gradients: share flushed to zero / subnormal, per tensor (mean over recorded steps)")
        ax.set_ylabel("share of elements")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    paths.append(output / "underflow_per_layer.png")
    files.save_figure(fig, paths[-1], dpi=100)

    fmt = parse_format(read_header(output / labels[0])["params"]["dtype"])
    fig = Figure(figsize=(10, 5))
    ax = fig.subplots()
    for label in labels:
        t = pd.read_csv(output / label / "telemetry.csv")
        first = t[t["step"] == t["step"].min()]
        total: dict[int, int] = {}
        for cell in first["hist_shadow"]:
            for e, c in decode_histogram(cell).items():
                total[e] = total.get(e, 0) + c
        if total:
            es = np.array(sorted(total))
            ax.step(es, [total[e] for e in es], where="post", label=f"fp32 shadow of S*g, {label}")
    for x, name in ((np.log2(fmt.smallest_subnormal), "smallest subnormal"), (np.log2(fmt.tiny), "smallest normal"),
                    (np.log2(fmt.max), "max")):
        ax.axvline(x, color="k", ls=":")
        ax.text(x, ax.get_ylim()[1] * 0.9, f" {fmt.name} {name}", rotation=90, va="top", fontsize=8)
    ax.axvspan(np.log2(fmt.smallest_subnormal) - 30, np.log2(fmt.smallest_subnormal) - 1, color="red", alpha=0.08)
    ax.set_yscale("log")
    ax.set_xlabel("floor(log2 |scaled gradient|)")
    ax.set_ylabel("elements (all tensors, first recorded step)")
    ax.set_title(f"gradient magnitudes vs {fmt.name}'s range (shaded: flushes to zero)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(output / "gradient_histogram.png")
    files.save_figure(fig, paths[-1], dpi=100)

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    for label in labels:
        s = pd.read_csv(output / label / "steps.csv")
        ax.step(s["step"], s["loss_scale"], where="post", label=label)
        skipped = s[s["skipped"].astype(str) == "True"]
        ax.plot(skipped["step"], skipped["loss_scale"], "x", color="red")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale (x: skipped step)")
    ax.legend()
    fig.tight_layout()
    paths.append(output / "scale_trajectory.png")
    files.save_figure(fig, paths[-1], dpi=100)
    return paths
