"""Figures: returned as Figure objects, no global matplotlib state touched, readable parts present."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib._pylab_helpers import Gcf
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from convprobe.analysis import figures
from convprobe.analysis.tables import add_bounds, fingerprint_table, frame_from_records
from convprobe.errors import InvalidArgument

BASE = {"backend": "emulated", "device": "cpu", "op": "conv2d", "format": "fp16", "seed": 0, "status": "ok"}


def _sweep() -> pd.DataFrame:
    rows = []
    for dist in ("uniform01", "normal"):
        for k in (9, 64, 512, 4096, 16384):
            rows.append({**BASE, "configuration": "fp16 sequential", "distribution": dist, "k": k,
                         "max_abs_sum_error": 2.0**-11 * np.sqrt(k)})
            rows.append({**BASE, "configuration": "fp32", "distribution": dist, "k": k,
                         "max_abs_sum_error": 0.0 if k == 9 else 2.0**-12})
    rows.append({**BASE, "configuration": "xla strict", "distribution": "normal", "k": 9, "status": "crashed"})
    return add_bounds(frame_from_records(rows, "sweep"))


@pytest.fixture(autouse=True)
def _no_global_state():
    params = dict(matplotlib.rcParams)
    managers = Gcf.get_num_fig_managers()
    yield
    assert Gcf.get_num_fig_managers() == managers  # nothing registered with pyplot
    assert dict(matplotlib.rcParams) == params  # includes the backend


def _saves(fig: Figure) -> None:
    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=40)
    fig.savefig(svg, format="svg")
    assert png.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.getvalue()[:500]


def test_error_vs_k_figure_draws_series_bounds_and_log_axes():
    fig = figures.error_vs_k_figure(_sweep())
    assert isinstance(fig, Figure)
    axes = fig.get_axes()
    assert len(axes) == 2  # one facet per distribution
    assert [ax.get_title() for ax in axes] == ["distribution: uniform01", "distribution: normal"]
    for ax in axes:
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert ax.get_xlabel() == "reduction length K = C_in·kh·kw"
    assert axes[0].get_ylabel() == "max |ŷ − y| / Σ|x·w|"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["fp16 sequential", "fp32"]
    assert "bound $\\gamma_K$: fp16 accumulation" in labels and "bound $\\lambda\\sqrt{K}\\,u$: fp32 accumulation" in labels
    data_colours = {line.get_color() for line in axes[0].get_lines() if not line.get_label().startswith("bound")
                    and line.get_marker() == "o"}
    bound_colours = {line.get_color() for line in axes[0].get_lines() if line.get_label().startswith("bound")}
    assert bound_colours and not bound_colours & data_colours  # bounds styled apart from data
    gamma16 = [ln for ln in axes[0].get_lines() if ln.get_label() == "bound $\\gamma_K$: fp16 accumulation"][0]
    assert gamma16.get_xdata().max() * 2.0**-11 < 1  # drawn only where gamma_K is defined
    assert any(t.get_text() == " exact (0)" for t in axes[0].texts)  # fp32 at K=9 was exact
    assert [t.get_text() for t in axes[0].get_xticklabels()][:2] == ["8", "32"]
    _saves(fig)


def test_error_vs_k_figure_bad_input():
    with pytest.raises(InvalidArgument, match="no 'ok' rows with a max_ulp_error value to plot"):
        figures.error_vs_k_figure(_sweep(), error="max_ulp_error")
    with pytest.raises(InvalidArgument, match="column 'colour' is not in the sweep schema"):
        figures.error_vs_k_figure(_sweep(), by="colour")
    with pytest.raises(InvalidArgument, match="missing column"):
        figures.error_vs_k_figure(pd.DataFrame({"k": [1]}))


def test_ulp_histogram_figure_counts_exact_and_infinite_outside_the_log_axis():
    rng = np.random.default_rng(2)
    errors = {"fp32 acc": np.concatenate([rng.uniform(0, 0.5, 500), [0.0, 0.0]]),
              "fp16 acc": np.concatenate([rng.uniform(1, 300, 500), [np.inf]])}
    fig = figures.ulp_histogram_figure(errors, "fp16", title="K = 4096")
    axes = fig.get_axes()
    assert len(axes) == 2  # one panel per series: overlapping distributions stay visible
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in axes)
    assert axes[-1].get_xlabel().startswith("ULP error in fp16")
    assert axes[0].get_title() == "K = 4096"
    notes = [[t.get_text() for t in ax.texts] for ax in axes]
    assert notes[0][0].startswith("fp32 acc  (n=502, max=0.") and notes[0][0].endswith("exact=2)")
    assert notes[1] == ["fp16 acc  (n=501, max=inf, exact=0, inf=1)"]
    assert all(any(line.get_xdata()[0] == 0.5 for line in ax.get_lines()) for ax in axes)  # the 0.5 ulp mark
    _saves(fig)
    single = figures.ulp_histogram_figure(np.zeros(3), "bf16")
    assert single.get_axes()[0].texts[0].get_text() == "outputs  (n=3, max=0, exact=3)"


def test_ulp_histogram_figure_bad_input():
    with pytest.raises(InvalidArgument, match=r"errors\['a'\] must hold ULP errors >= 0"):
        figures.ulp_histogram_figure({"a": [np.nan]})
    with pytest.raises(InvalidArgument, match=r"errors\['a'\] is empty"):
        figures.ulp_histogram_figure({"a": []})
    with pytest.raises(InvalidArgument, match="fmt must be one of"):
        figures.ulp_histogram_figure([0.5], "fp12")


def test_table_figure_renders_and_colours_cells():
    rows = [{"backend": "tensorflow", "device": "cpu", "probe": "fingerprint", "op": "conv2d",
             "configuration": c, "property": "accumulation", "value": v, "status": s}
            for c, v, s in (("default", "fp32", "ok"), ("fp16 accumulate", "fp16", "ok"), ("strict", "", "crashed"))]
    table = fingerprint_table(frame_from_records(rows, "probe"))
    fig = figures.table_figure(table, title="Fingerprint")
    (ax,) = fig.get_axes()
    cells = ax.tables[0].get_celld()
    assert cells[(0, 2)].get_text().get_text() == "accumulation"
    assert cells[(1, 2)].get_text().get_text() == "fp32"
    assert cells[(1, 2)].get_facecolor() == to_rgba(figures.DEFAULT_HIGHLIGHT["fp32"])
    assert cells[(2, 2)].get_facecolor() == to_rgba(figures.DEFAULT_HIGHLIGHT["fp16"])
    assert cells[(3, 2)].get_text().get_text() == "crashed"
    assert ax.get_title(loc="left") == "Fingerprint"
    _saves(fig)
    with pytest.raises(InvalidArgument, match="df has 3 rows; table_figure renders at most max_rows=2"):
        figures.table_figure(table, max_rows=2)
    with pytest.raises(InvalidArgument, match="df must be a pandas DataFrame; received list"):
        figures.table_figure([1, 2])


def test_a_layer_map_cell_wraps_a_long_spec_and_points_to_the_json():
    """A columns spec of several hundred characters fits its cell in at most three lines, the
    last saying where the whole spec is; a short spec stays on one line, whole."""
    lanes = "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16)"
    long_spec = f"columns(splitk(length=16, sequential:fp16:product=fp16, first={lanes} | {lanes}, combine=fp16) * 3)"
    matches = {"tensorflow/cpu/x": {"conv1 / conv2d": {"status": "ok", "op": "conv2d",
                                                       "summary": {"best": long_spec, "fractions": {"9": 1.0}}},
                                    "conv2 / conv2d": {"status": "ok", "op": "conv2d",
                                                       "summary": {"best": "sequential:fp16", "fractions": {"9": 0.5}}}}}
    fig = figures.layer_map_figure(matches)
    texts = [t.get_text() for t in fig.axes[0].texts]
    long_cell = next(t for t in texts if t.startswith("columns("))
    assert len(long_cell.split("\n")) == 4 and "the whole spec: the JSON's best" in long_cell  # 3 lines + the match
    assert all(len(line) <= 72 for line in long_cell.split("\n"))
    assert "none matches; closest:\nsequential:fp16\n50.0%" in texts  # below 100%: not shown as the answer


def test_a_layer_map_cell_says_an_op_is_not_a_direct_sum():
    matches = {"gpu/x": {"conv1 / conv2d": {"status": "ok", "op": "conv2d", "summary": {
        "best": None, "fractions": {}, "direct": {"direct": False}}}}}
    texts = [t.get_text() for t in figures.layer_map_figure(matches).axes[0].texts]
    assert texts == ["not a direct sum\nof products"]
