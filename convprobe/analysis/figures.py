"""Figures for every kind of result (sweep, probes, replay, training runs); each function returns a matplotlib `Figure`.

Figures are built on `matplotlib.figure.Figure` directly, never through pyplot:
no global figure registry, no backend switch, no rcParams change, nothing shown.
The caller saves with `fig.savefig("x.png")` or `"x.svg"` (the format follows
the suffix) and may drop the object afterwards.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from matplotlib.transforms import Bbox

from convprobe.analysis.bounds import DEFAULT_LAMBDA, dot_error_bound, probabilistic_confidence
from convprobe.analysis.tables import SWEEP_SCHEMA, validate_frame
from convprobe.errors import InvalidArgument
from convprobe.formats import Format, parse_format
from convprobe.render import share_text

__all__ = [
    "error_vs_k_figure",
    "ulp_histogram_figure",
    "table_figure",
    "match_fraction_figure",
    "layer_map_figure",
    "compare_figure",
    "replay_figure",
    "training_run_figure",
    "comparison_figure",
    "comparison_table",
    "DEFAULT_HIGHLIGHT",
]

#: Cell colours of `table_figure`, by exact cell text: fp16 warm, fp32 cool, failures red.
DEFAULT_HIGHLIGHT: dict[str, str] = {
    "fp16": "#fcd5b4",
    "fp32": "#c6dbef",
    "fp64": "#9ecae1",
    "bf16": "#d9ead3",
    "crashed": "#f4a6a6",
    "failed": "#f4a6a6",
    "timeout": "#f4c7a6",
    "unsupported": "#dddddd",
}

#: Data series take saturated colours; bounds are drawn in greys only (and thinner, without
#: markers), so a bound line can never be read as a measured one.
_SERIES_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#006d2c")
_BOUND_COLOURS = {"fp16": "#4d4d4d", "bf16": "#6e6e6e", "fp32": "#9a9a9a", "fp64": "#bdbdbd",
                  "fp8_e4m3": "#2b2b2b", "fp8_e5m2": "#3b3b3b"}


def _power_of_two_axis(ax, ks: np.ndarray) -> None:
    """log2 x axis with ticks at the powers of two spanned, labelled as plain integers."""
    ax.set_xscale("log", base=2)
    lo, hi = int(np.floor(np.log2(ks.min()))), int(np.ceil(np.log2(ks.max())))
    step = max(1, -(-(hi - lo + 1) // 7))  # at most 7 labels: 16 64 256 ... stay legible
    ax.xaxis.set_major_locator(FixedLocator([2.0**e for e in range(lo, hi + 1, step)]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))


def error_vs_k_figure(
    df: pd.DataFrame,
    *,
    error: str = "max_abs_sum_error",
    accumulators: Iterable[str | Format] = ("fp16", "fp32"),
    lam: float = DEFAULT_LAMBDA,
    output: str | Format | None = None,
    by: str = "configuration",
    facet: str | None = "distribution",
    title: str | None = None,
) -> Figure:
    """Error versus reduction length K, one line per `by`, with the bounds of each accumulator.

    Each line is the worst `error` over seeds at each K (status "ok" rows only).
    For every accumulator format the deterministic gamma_K(u) (solid, drawn
    where K u < 1) and the probabilistic lambda sqrt(K) u (dashed) are drawn
    from `bounds.dot_error_bound`, with `output` rounding added when given. Use
    error="max_abs_sum_error" to compare like with like: the bounds bound
    |error| / sum|x_i w_i|. Exact results (error 0) sit on a marked floor.
    """
    frame = validate_frame(df, SWEEP_SCHEMA)
    for name in (error, by) + ((facet,) if facet else ()):
        if name not in frame.columns:
            raise InvalidArgument(f"column {name!r} is not in the sweep schema")
    ok = frame[(frame["status"] == "ok") & frame[error].notna()]
    if ok.empty:
        raise InvalidArgument(f"no 'ok' rows with a {error} value to plot")
    accs = [parse_format(a, argument="accumulators") for a in accumulators]
    facets = list(dict.fromkeys(ok[facet])) if facet else [None]
    fig = Figure(figsize=(5.2 * len(facets) + 2.6, 4.6), layout="constrained")
    axes = fig.subplots(1, len(facets), sharey=True, squeeze=False)[0]
    ks_all = ok["k"].to_numpy(dtype=np.float64)
    positive = ok[error].to_numpy(dtype=np.float64)
    positive = positive[(positive > 0) & np.isfinite(positive)]
    floor = float(positive.min()) / 8 if positive.size else 1e-8
    any_exact = bool((ok[error] == 0).any())
    out_note = f" + {parse_format(output, argument='output').name} output" if output is not None else ""
    k_grid = np.unique(np.round(np.geomspace(ks_all.min(), ks_all.max(), 200)).astype(np.int64))
    series = list(dict.fromkeys(ok[by]))
    colours = {s: _SERIES_COLOURS[i % len(_SERIES_COLOURS)] for i, s in enumerate(series)}
    top = 1.0
    for ax, value in zip(axes, facets):
        part = ok if value is None else ok[ok[facet] == value]
        for name in series:
            rows = part[part[by] == name]
            if rows.empty:
                continue
            worst = rows.groupby("k")[error].max().sort_index()
            ks = worst.index.to_numpy(dtype=np.float64)
            ys = worst.to_numpy(dtype=np.float64)
            shown = np.where(ys > 0, ys, floor)
            ax.plot(ks, shown, marker="o", markersize=4, linewidth=1.6, color=colours[name], label=str(name))
            exact = ys == 0
            if exact.any():
                ax.plot(ks[exact], shown[exact], linestyle="none", marker="v", markersize=7,
                        markerfacecolor="white", color=colours[name])
        for acc in accs:
            colour = _BOUND_COLOURS.get(acc.name, "#444444")
            defined = k_grid * acc.unit_roundoff < 1.0
            if defined.any():
                g = dot_error_bound(k_grid[defined], acc, "deterministic", output=output)
                keep = np.asarray(g) <= top
                ax.plot(k_grid[defined][keep], np.asarray(g)[keep], color=colour, linewidth=0.9,
                        linestyle=(0, (6, 2)), label=f"bound $\\gamma_K$: {acc.name} accumulation{out_note}")
            p = dot_error_bound(k_grid, acc, "probabilistic", lam=lam, output=output)
            ax.plot(k_grid, p, color=colour, linewidth=0.9, linestyle=(0, (1, 1.5)),
                    label=f"bound $\\lambda\\sqrt{{K}}\\,u$: {acc.name} accumulation{out_note}")
            ax.text(k_grid[-1], float(np.asarray(p)[-1]), f" {acc.name}", color=colour, fontsize=7, va="center")
        if any_exact:
            ax.axhline(floor, color="#999999", linewidth=0.8, linestyle=":")
            ax.text(ks_all.min(), floor, " exact (0)", va="bottom", ha="left", fontsize=8, color="#666666")
        ax.set_yscale("log")
        _power_of_two_axis(ax, ks_all)
        ax.set_xlabel("reduction length K = C_in·kh·kw")
        ax.grid(True, which="major", alpha=0.3)
        if value is not None:
            ax.set_title(f"{facet}: {value}", fontsize=10)
    axes[0].set_ylabel(_ERROR_LABELS.get(error, error))
    axes[0].set_ylim(floor / 2 if any_exact else floor * 2, top * 2)
    handles, labels = axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    confidence = probabilistic_confidence(lam, min(a.unit_roundoff for a in accs)) if accs else None
    legend_title = (
        f"grey: bounds (dashed γ_K, dotted λ√K·u); λ = {lam:g}: holds w.p.\n≥ {confidence:.3f} per rounding chain (Higham & Mary 2019)"
        if confidence is not None
        else None
    )
    fig.legend(list(seen.values()), list(seen.keys()), loc="outside right center", fontsize=8,
               title=legend_title, title_fontsize=8, frameon=False)
    fig.suptitle(title or f"Error versus reduction length ({_ERROR_LABELS.get(error, error)})", fontsize=11)
    return fig


_ERROR_LABELS = {
    "max_abs_sum_error": "max |ŷ − y| / Σ|x·w|",
    "max_relative_error": "max |ŷ − y| / |y|",
    "median_relative_error": "median |ŷ − y| / |y|",
    "relative_norm_error": "‖ŷ − y‖₂ / ‖y‖₂",
    "max_ulp_error": "max ULP error",
    "median_ulp_error": "median ULP error",
}


def ulp_histogram_figure(
    errors: Mapping[str, object] | object,
    fmt: str | Format = "fp16",
    *,
    bins: int = 60,
    title: str | None = None,
) -> Figure:
    """Histogram of ULP errors (from `metrics.ulp_error`), one outline per labelled series.

    Log-spaced bins on a log x axis, so half-ulp rounding and thousand-ulp
    accumulation errors are both visible; exact results (0 ulps) and infinite
    errors cannot sit on that axis and are counted in the legend instead. The
    line at 0.5 ulp marks correct rounding.
    """
    f = parse_format(fmt, argument="fmt")
    data = dict(errors) if isinstance(errors, Mapping) else {"outputs": errors}
    if not data:
        raise InvalidArgument("errors must hold at least one series")
    arrays = {}
    for label, values in data.items():
        arr = np.asarray(values, dtype=np.float64).ravel()
        if arr.size == 0:
            raise InvalidArgument(f"errors[{label!r}] is empty")
        if np.any(np.isnan(arr)) or np.any(arr < 0):
            raise InvalidArgument(f"errors[{label!r}] must hold ULP errors >= 0 (ulp_error never gives NaN)")
        arrays[str(label)] = arr
    finite_pos = np.concatenate([a[(a > 0) & np.isfinite(a)] for a in arrays.values()])
    lo = min(float(finite_pos.min()) if finite_pos.size else 0.5, 2.0**-6)
    hi = max(float(finite_pos.max()) if finite_pos.size else 1.0, 1.0) * 1.05
    edges = np.geomspace(lo, hi, bins + 1)
    # One panel per series on shared axes (small multiples): identical or overlapping
    # distributions stay visible, which outlines drawn over each other would hide.
    fig = Figure(figsize=(7.5, 1.2 + 1.5 * len(arrays)), layout="constrained")
    axes = fig.subplots(len(arrays), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    counts_of = {label: np.histogram(arr[(arr > 0) & np.isfinite(arr)], bins=edges)[0]
                 for label, arr in arrays.items()}
    peak = max(1, *(int(c.max(initial=0)) for c in counts_of.values()))
    for i, (ax, (label, arr)) in enumerate(zip(axes, arrays.items())):
        colour = _SERIES_COLOURS[i % len(_SERIES_COLOURS)]
        zeros = int(np.count_nonzero(arr == 0))
        infs = int(np.count_nonzero(np.isinf(arr)))
        note = f"{label}  (n={arr.size}, max={_fmt_ulps(arr.max())}, exact={zeros}" + (f", inf={infs})" if infs else ")")
        ax.stairs(counts_of[label], edges, linewidth=1.6, color=colour, fill=True, alpha=0.35)
        ax.stairs(counts_of[label], edges, linewidth=1.6, color=colour)
        ax.axvline(0.5, color="black", linewidth=1.0, linestyle="--")
        ax.text(0.01, 0.92, note, transform=ax.transAxes, fontsize=8, va="top")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylim(0.7, peak * 1.6)  # fixed before the log scale: autoscaling all-zero counts warns
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("outputs", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
    axes[-1].set_xlabel(f"ULP error in {f.name} (|ŷ − y| / ulp(y), log scale); dashed: 0.5 ulp, correctly rounded")
    axes[0].set_title(title or f"ULP error distribution ({f.name})", fontsize=11)
    return fig


def _fmt_ulps(value: float) -> str:
    if not np.isfinite(value):
        return "inf"
    return f"{value:.3g}"


def table_figure(
    df: pd.DataFrame,
    *,
    title: str | None = None,
    highlight: Mapping[str, str] | None = None,
    max_rows: int = 60,
) -> Figure:
    """Render a DataFrame (e.g. `tables.fingerprint_table`) as a table image.

    Columns are sized to their longest text; cells whose text is a key of
    `highlight` (default `DEFAULT_HIGHLIGHT`: fp16 warm, fp32 cool, crashes
    red) are coloured, so the pattern is visible before any cell is read.
    """
    if not isinstance(df, pd.DataFrame):
        raise InvalidArgument(f"df must be a pandas DataFrame; received {type(df).__name__}")
    if df.shape[1] == 0:
        raise InvalidArgument("df has no columns to render")
    if len(df) > max_rows:
        raise InvalidArgument(f"df has {len(df)} rows; table_figure renders at most max_rows={max_rows}")
    colours = DEFAULT_HIGHLIGHT if highlight is None else dict(highlight)
    header = [str(c) for c in df.columns]
    body = [["" if _missing(v) else str(v) for v in row] for row in df.itertuples(index=False)]
    widths = [max([len(h)] + [len(r[j]) for r in body]) + 2 for j, h in enumerate(header)]
    char_in = 0.085
    fig_w = max(4.0, sum(widths) * char_in + 0.4)
    fig_h = 0.32 * (len(body) + 1) + (0.55 if title else 0.2)
    fig = Figure(figsize=(fig_w, fig_h), layout="constrained")
    ax = fig.add_subplot()
    ax.set_axis_off()
    table = ax.table(
        cellText=body or [[""] * len(header)],
        colLabels=header,
        colWidths=[w / sum(widths) for w in widths],
        cellLoc="left",
        loc="upper center",
        bbox=Bbox.from_bounds(0.0, 0.0, 1.0, 1.0),
    )
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    for (row, col), cell in table.get_celld().items():
        cell.set_edgecolor("#bbbbbb")
        cell.set_linewidth(0.5)
        if row == 0:
            cell.set_facecolor("#34495e")
            cell.get_text().set_color("white")
            cell.get_text().set_fontweight("bold")
            continue
        text = cell.get_text().get_text()
        base = "#f7f7f7" if row % 2 == 0 else "white"
        cell.set_facecolor(colours.get(text, base))
    if title:
        ax.set_title(title, fontsize=11, loc="left")
    return fig


def _missing(value: object) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def match_fraction_figure(matches: dict, op: str) -> Figure:
    """Match fraction versus K of each configuration's best model for one op (a `Figure`).

    `matches`: {configuration: {op: {"status", "summary": {"best", "fractions"}}}} as
    written by `convprobe identify --output FILE.json`.
    """
    fig = Figure(figsize=(13.5, 5.0), layout="constrained")
    ax = fig.add_subplot()
    colours = _SERIES_COLOURS
    markers = "osD^v<>ph*"
    ks_all: set[int] = set()
    drawn = 0
    for i, (label, per_op) in enumerate(matches.items()):
        entry = per_op.get(op)
        if not entry or entry.get("status") != "ok" or not entry["summary"].get("fractions"):
            continue
        fractions = {int(k): float(f) for k, f in entry["summary"]["fractions"].items()}
        ks = sorted(fractions)
        ks_all.update(ks)
        name = label.replace("tensorflow/", "tf/")
        # earlier series drawn wider underneath, so identical curves stay visible
        ax.plot(ks, [100 * fractions[k] for k in ks], marker=markers[i % len(markers)],
                linewidth=max(1.2, 4.0 - 0.4 * i), markersize=max(4.0, 8.0 - 0.5 * i), alpha=0.85,
                color=colours[i % len(colours)], label=f"{name}: {entry['summary']['best']}", zorder=2 + i)
        drawn += 1
    if ks_all:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ks_all))
        ax.set_xticklabels([str(k) for k in sorted(ks_all)])
        ax.minorticks_off()
    ax.set_ylim(-3, 103)
    ax.axhline(100, color="#999999", linewidth=0.8, linestyle=":")
    ax.set_xlabel("reduction length K")
    ax.set_ylabel("outputs bitwise equal to the best model (%)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"{op}: how far does the best emulator model reproduce each configuration?", fontsize=11)
    if drawn:
        fig.legend(loc="outside right center", ncols=1, fontsize=8, frameon=False,
                   title="configuration: best model", title_fontsize=8)
    return fig


#: A cell's spec wraps at this many characters, over at most this many lines.
_CELL_WIDTH, _CELL_LINES = 72, 3


def _cell_spec(spec: str) -> str:
    """A spec wrapped to fit its cell; a longer one ends in a pointer to the JSON, which holds it whole."""
    lines = textwrap.wrap(spec, _CELL_WIDTH, break_on_hyphens=False)
    if len(lines) > _CELL_LINES:
        lines = [*lines[:_CELL_LINES - 1], "... (the whole spec: the JSON's best)"]
    return "\n".join(lines)


def layer_map_figure(matches: dict) -> Figure:
    """Per-layer map of `identify --resnet-size/--keras-model/--input-shape`: one row per
    (configuration, layer), one column per op; each cell the best model and its match.

    `matches`: {configuration: {"layer / op": {"status", "op", "layer", "summary"}}}.
    """
    from matplotlib.colors import LinearSegmentedColormap

    cells: dict[tuple[str, str], dict] = {}
    ops: list[str] = []
    for label, per_key in matches.items():
        for key, entry in per_key.items():
            op = entry.get("op", key.rsplit(" / ", 1)[-1])
            row = f"{label.replace('tensorflow/', 'tf/')}: {key.rsplit(' / ', 1)[0] if ' / ' in key else 'layer'}"
            cells[(row, op)] = entry
            ops = list(dict.fromkeys([*ops, op]))
    rows = list(dict.fromkeys(r for r, _ in cells))
    fig = Figure(figsize=(6.0 + 4.2 * len(ops), 1.2 + 0.6 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    values = np.full((len(rows), len(ops)), np.nan)
    cmap = LinearSegmentedColormap.from_list("match", ["#d62728", "#ffdd57", "#2ca02c"])
    for (row, op), entry in cells.items():
        i, j = rows.index(row), ops.index(op)
        summary = entry.get("summary") or {}
        fraction = next(iter(summary.get("fractions", {}).values()), None)
        if (summary.get("direct") or {}).get("direct") is False:
            text = "not a direct sum\nof products"
        elif entry.get("status") == "ok" and fraction is not None:
            values[i, j] = 100 * float(fraction)
            closest = "" if float(fraction) == 1.0 else "none matches; closest:\n"
            text = f"{closest}{_cell_spec(summary['best'])}\n{share_text(float(fraction))}"
        else:
            text = textwrap.fill(str(entry.get("error") or entry.get("status")), _CELL_WIDTH, break_on_hyphens=False)
        ax.text(j, i, text, ha="center", va="center", fontsize=6.5)
    ax.imshow(values, cmap=cmap, vmin=90, vmax=100, aspect="auto", alpha=0.55)  # anything short of 100% shows
    ax.set_xticks(range(len(ops)), ops, fontsize=9)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_title("best emulator model per layer and op (share of outputs bitwise equal)", fontsize=11)
    return fig


def compare_figure(frame: pd.DataFrame, *, title: str | None = None) -> Figure:
    """`convprobe compare`: worst fp16-ulp error of the real fp16 conv beside fp32-compute-then-cast,
    per configuration. `frame`: configuration, real_max_ulp, fake_max_ulp (ok rows only)."""
    labels = [str(c).replace("tensorflow/", "tf/") for c in frame["configuration"]]
    y = np.arange(len(labels))
    fig = Figure(figsize=(9.0, 1.2 + 0.45 * max(1, len(labels))), layout="constrained")
    ax = fig.add_subplot()
    real = frame["real_max_ulp"].astype(float).to_numpy()
    fake = frame["fake_max_ulp"].astype(float).to_numpy()
    ax.barh(y - 0.2, real, height=0.4, color=_SERIES_COLOURS[1], label="real fp16 conv")
    ax.barh(y + 0.2, fake, height=0.4, color=_SERIES_COLOURS[0], label="fp32 compute, then cast to fp16")
    ax.axvline(0.5, color="black", linewidth=1.0, linestyle="--", label="0.5 ulp: correctly rounded")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("worst error against the float64 reference (fp16 ulps)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "compare: real fp16 convolution vs fp32 compute then cast", fontsize=11)
    return fig


def replay_figure(rows: list[dict], *, title: str | None = None) -> Figure:
    """`convprobe replay`: share of each real-GPU vector set the preset reproduces bit for bit."""
    labels = [f"{r['gpu']} {r['input']}->{r['output']} ({r['model']})" for r in rows]
    shares = np.array([100.0 * r["matches"] / r["vectors"] if r["vectors"] else 0.0 for r in rows])
    y = np.arange(len(rows))
    fig = Figure(figsize=(9.0, 1.2 + 0.3 * max(1, len(rows))), layout="constrained")
    ax = fig.add_subplot()
    colours = [_SERIES_COLOURS[2] if s == 100.0 else _SERIES_COLOURS[1] for s in shares]
    ax.barh(y, shares, color=colours)
    for i, r in enumerate(rows):
        ax.text(1, i, f"{r['matches']} / {r['vectors']}", va="center", fontsize=7, color="white")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("vectors reproduced bit for bit (%); green: the whole set")
    ax.set_title(title or "replay: real tensor-core outputs through the GPU presets", fontsize=11)
    return fig


def training_run_figure(steps: pd.DataFrame, telemetry: pd.DataFrame, *, title: str) -> Figure:
    """One training run: loss and loss scale per step (x: skipped steps), and per tensor the mean
    share of gradients flushed to zero or left subnormal, labelled with the layer names ('(fp32)':
    computed in fp32 under mixed precision, so it cannot flush)."""
    fig = Figure(figsize=(12.0, 9.0), layout="constrained")
    grid = fig.add_gridspec(3, 2)
    ax_loss = fig.add_subplot(grid[0, 0])
    ax_loss.plot(steps["step"], steps["loss"].astype(float), color=_SERIES_COLOURS[0])
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, alpha=0.3)
    ax_scale = fig.add_subplot(grid[0, 1])
    ax_scale.step(steps["step"], steps["loss_scale"].astype(float), where="post", color=_SERIES_COLOURS[3])
    skipped = steps[steps["skipped"].astype(str) == "True"]
    ax_scale.plot(skipped["step"], skipped["loss_scale"].astype(float), "x", color=_SERIES_COLOURS[1],
                  label="skipped step")
    ax_scale.set_yscale("log", base=2)
    ax_scale.set_xlabel("step")
    ax_scale.set_ylabel("loss scale")
    if len(skipped):
        ax_scale.legend(fontsize=8)
    for row, kind in ((1, "weight"), (2, "activation")):
        ax = fig.add_subplot(grid[row, :])
        part = telemetry[telemetry["kind"] == kind]
        means = part.groupby(["index", "layer"], sort=True)[["flushed_fraction", "subnormal_fraction"]].mean()
        x = np.arange(len(means))
        ax.plot(x, means["flushed_fraction"], marker="o", ms=3, color=_SERIES_COLOURS[1], label="flushed to zero")
        ax.plot(x, means["subnormal_fraction"], marker="s", ms=3, ls="--", color=_SERIES_COLOURS[0],
                label="subnormal")
        compute = set(telemetry.loc[telemetry["kind"] == "activation", "precision"]) if "precision" in part else set()
        precision = part.groupby(["index", "layer"], sort=True)["precision"].first() if compute else None
        names = [f"{layer} (fp32)" if precision is not None and precision[(i, layer)] not in compute else layer
                 for i, layer in means.index]
        ax.set_xticks(x, names, rotation=90, fontsize=6)
        ax.set_ylabel("share of elements")
        ax.set_title(f"{kind} gradients, mean over recorded steps", fontsize=10)
        ax.grid(True, alpha=0.3)
        if len(means):
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


def _accuracy_text(mean, std) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "") + " %"


def comparison_table(arms: list[dict]) -> pd.DataFrame:
    """A training comparison's arms (`train-comparison` 'arms' rows) as a display table: eval
    accuracy and final loss as mean ± sample std (ddof = 1), runs finished of runs, skipped steps
    and the mean underflow of activation and weight gradients at the last recorded step."""
    rows = []
    for a in arms:
        loss = "-" if a["final_loss_mean"] is None else f"{a['final_loss_mean']:.4f}" + (
            f" ± {a['final_loss_std']:.4f}" if a["final_loss_std"] is not None else "")
        act, weight = a.get("underflow_activation_mean"), a.get("underflow_weight_mean")
        rows.append({"arm": a["arm"], "runs": f"{a['finished']}/{a['runs']}",
                     "eval accuracy (mean ± std)": _accuracy_text(a["eval_accuracy_mean"], a["eval_accuracy_std"]),
                     "final loss (mean ± std)": loss, "skipped steps": a["skipped_steps"],
                     "underflow act / weight": "-" if act is None else f"{act:.3%} / {weight or 0:.3%}"})
    return pd.DataFrame(rows)


def comparison_figure(runs: list[dict], arms: list[dict], *, chance: float | None = None,
                      title: str | None = None) -> Figure:
    """A training comparison: final evaluation accuracy per arm, each seed's run a point (seeds
    side by side) and the arm's mean ± sample standard deviation (ddof = 1) beside them. The axis
    spans the runs' accuracies; `chance` is a dashed line where it falls inside, else named in
    the legend. Runs that did not finish are counted under the arm's name."""
    seeds = sorted({r["seed"] for r in runs})
    markers = "osD^v<>pP*"
    fig = Figure(figsize=(max(6.0, 1.8 * len(arms) + 2.5), 4.8), layout="constrained")
    ax = fig.add_subplot()
    values = []
    for i, arm in enumerate(arms):
        for j, seed in enumerate(seeds):
            found = [r["eval_accuracy"] for r in runs
                     if r["arm"] == arm["arm"] and r["seed"] == seed and r["eval_accuracy"] is not None]
            x = i - 0.3 + 0.3 * j / max(1, len(seeds) - 1)
            for accuracy in found:
                values.append(100 * accuracy)
                ax.plot(x, 100 * accuracy, marker=markers[j % len(markers)], ls="none", ms=7,
                        color=_SERIES_COLOURS[j % len(_SERIES_COLOURS)], alpha=0.85,
                        label=f"seed {seed}" if i == 0 else None)
        if arm["eval_accuracy_mean"] is not None:
            std = arm["eval_accuracy_std"]
            ax.errorbar(i + 0.2, 100 * arm["eval_accuracy_mean"], yerr=None if std is None else 100 * std,
                        fmt="_", ms=18, mew=2, capsize=6, color="black",
                        label="mean ± std (ddof = 1)" if i == 0 else None)
    names = [f"{a['arm']}\n{a['finished']}/{a['runs']} runs" if a["finished"] < a["runs"] else a["arm"]
             for a in arms]
    ax.set_xticks(np.arange(len(arms)), names, fontsize=8)
    ax.set_xlim(-0.6, len(arms) - 0.4)
    if values:
        low, high = min(values), max(values)
        pad = max(0.5, 0.15 * (high - low))
        ax.set_ylim(max(0.0, low - pad), min(100.0, high + pad) + (0.2 if high + pad >= 100 else 0))
    if chance is not None:
        bottom, top = ax.get_ylim()
        inside = bottom <= 100 * chance <= top
        ax.axhline(100 * chance, color="grey", ls="--", lw=1,
                   label=f"chance ({100 * chance:.0f} %)" + ("" if inside else ", below the axis"))
        ax.set_ylim(bottom, top)
    ax.set_ylabel("final evaluation accuracy (%)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "final evaluation accuracy per arm", fontsize=11)
    return fig
