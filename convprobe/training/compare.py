"""`--compare-loss-scaling`: the same run without scaling, static and dynamic.

Three runs with the same seed, so the same initial weights and the same
batches, differ only in the loss scale. `summarise` reduces their telemetry to
one table (per layer, per kind, per scale: mean fractions over the recorded
steps, routing zeros apart) and `plot_comparison` draws the figures:
underflow per layer per scale, the magnitude histogram of the fp32 shadow
gradients with the format's representable range marked, and the loss-scale
trajectory.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from convprobe import files
from convprobe.training.config import LossScaleMode, LossScaleSpec, TrainConfig
from convprobe.training.records import RunFiles, claim_directory

__all__ = ["comparison_specs", "run_comparison", "summarise", "overview", "plot_comparison", "format_table"]

#: What a comparison writes at its top level, beside one run directory per loss scale.
COMPARISON_FILES = ("comparison.csv", "comparison.txt", "underflow_per_layer.png", "gradient_histogram.png",
                    "scale_trajectory.png")

FRACTIONS = ("flushed_fraction", "subnormal_fraction", "routing_zero_fraction", "lost_fraction",
             "underflow_fraction", "shadow_underflow_fraction")


def comparison_specs(config: TrainConfig, static_scale: float | None = None) -> list[LossScaleSpec]:
    """none, static (the format's default scale, or 128 where that default is 1), dynamic."""
    fmt = config.format
    static = static_scale or (fmt.default_loss_scale if fmt.default_loss_scale > 1 else 128.0)
    return [LossScaleSpec(LossScaleMode.NONE, 1.0), LossScaleSpec(LossScaleMode.STATIC, float(static)),
            LossScaleSpec(LossScaleMode.DYNAMIC, 2.0**15)]


def run_comparison(config: TrainConfig, output: str | Path, *, static_scale: float | None = None,
                   figures: bool = True, eager: bool = False):
    """Run the three trainings into output/<label>/ and write the table and figures."""
    from convprobe.training.trainer import train

    output = Path(output)
    specs = comparison_specs(config, static_scale)
    labels = [spec.label for spec in specs]
    claim_directory(output, COMPARISON_FILES, own_directories=labels, what="a convprobe comparison",
                    recorded=any((output / label / "header.json").is_file() for label in labels))
    configs = [replace(config, loss_scale=spec, output=str(output / spec.label)) for spec in specs]
    with files.directory_lock(output):
        for run_config in configs:  # every run checked before the first one trains
            RunFiles(run_config.output).plan(run_config.to_json())
        runs = {}
        for spec, run_config in zip(specs, configs):
            runs[spec.label] = train(run_config, eager=eager)
        table = summarise(output, list(runs))
        files.write_atomic(output / "comparison.csv", table.to_csv(index=False))
        files.write_atomic(output / "comparison.txt", format_table(table))
        if figures:
            plot_comparison(output, list(runs))
    return runs, table


def summarise(output: str | Path, labels: list[str]):
    """Long table: scale, kind, index, layer, precision, same_gradient_as, mean fractions over
    the recorded steps."""
    import pandas as pd

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
    import pandas as pd

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from convprobe.formats import parse_format
    from convprobe.training.records import read_header
    from convprobe.training.telemetry import decode_histogram

    output = Path(output)
    paths = []
    table = summarise(output, labels)
    fig, axes = plt.subplots(2, 1, figsize=(14, 10), sharey=False)
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
    plt.close(fig)

    fmt = parse_format(read_header(output / labels[0])["params"]["dtype"])
    fig, ax = plt.subplots(figsize=(10, 5))
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
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
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
    plt.close(fig)
    return paths
