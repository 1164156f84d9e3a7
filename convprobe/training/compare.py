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

from convprobe.training.config import LossScaleMode, LossScaleSpec, TrainConfig

__all__ = ["comparison_specs", "run_comparison", "summarise", "plot_comparison", "format_table"]

FRACTIONS = ("flushed_fraction", "subnormal_fraction", "routing_zero_fraction", "lost_fraction",
             "shadow_underflow_fraction")


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
    output.mkdir(parents=True, exist_ok=True)
    runs = {}
    for spec in comparison_specs(config, static_scale):
        run_config = replace(config, loss_scale=spec, output=str(output / spec.label))
        runs[spec.label] = train(run_config, eager=eager)
    table = summarise(output, list(runs))
    table.to_csv(output / "comparison.csv", index=False)
    (output / "comparison.txt").write_text(format_table(table), encoding="utf-8")
    if figures:
        plot_comparison(output, list(runs))
    return runs, table


def summarise(output: str | Path, labels: list[str]):
    """Long table: scale, kind, index, layer, mean fractions over recorded steps."""
    import pandas as pd

    frames = []
    for label in labels:
        t = pd.read_csv(Path(output) / label / "telemetry.csv")
        g = t.groupby(["kind", "index", "layer"], sort=False)
        agg = g[list(FRACTIONS)].mean()
        agg["recorded_steps"] = g.size()
        agg["max_flushed_fraction"] = g["flushed_fraction"].max()
        agg = agg.reset_index()
        agg.insert(0, "scale", label)
        frames.append(agg)
    return pd.concat(frames, ignore_index=True)


def format_table(table) -> str:
    """Per layer: flushed / subnormal fraction for each scale, routing zeros apart."""
    labels = list(dict.fromkeys(table["scale"]))
    pivot = table.pivot_table(index=["kind", "index", "layer"], columns="scale",
                              values=["flushed_fraction", "subnormal_fraction"], sort=False)
    routing = table[table["scale"] == labels[0]].set_index(["kind", "index", "layer"])["routing_zero_fraction"]
    lines = []
    head = f"{'kind':<10} {'layer':<34} {'routing0':>8} " + " ".join(
        f"{'flush:' + label:>18} {'subn:' + label:>18}" for label in labels)
    lines.append(head)
    for key in pivot.index:
        kind, _, layer = key
        cells = " ".join(f"{pivot.loc[key, ('flushed_fraction', label)]:>18.3e} "
                         f"{pivot.loc[key, ('subnormal_fraction', label)]:>18.3e}" for label in labels)
        lines.append(f"{kind:<10} {layer[:34]:<34} {routing.loc[key]:>8.3f} {cells}")
    totals = table.groupby("scale", sort=False)[["flushed_fraction", "subnormal_fraction"]].mean()
    lines.append("")
    lines.append("mean over tensors: " + "; ".join(
        f"{label}: flushed {totals.loc[label, 'flushed_fraction']:.3e}, "
        f"subnormal {totals.loc[label, 'subnormal_fraction']:.3e}"
        for label in labels))
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
    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharey=False)
    for ax, kind in zip(axes, ("weight", "activation")):
        for label in labels:
            part = table[(table["scale"] == label) & (table["kind"] == kind)]
            ax.plot(range(len(part)), part["flushed_fraction"], marker="o", ms=3, label=f"flushed, {label}")
            ax.plot(range(len(part)), part["subnormal_fraction"], ls="--", label=f"subnormal, {label}")
        ax.set_title(f"{kind} gradients: fraction flushed to zero / subnormal, per tensor")
        ax.set_xlabel("tensor (input to output)")
        ax.set_ylabel("fraction")
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    paths.append(output / "underflow_per_layer.png")
    fig.savefig(paths[-1], dpi=100)
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
    fig.savefig(paths[-1], dpi=100)
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
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
