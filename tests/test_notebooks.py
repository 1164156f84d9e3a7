"""The notebooks run top to bottom on a real Jupyter kernel, headlessly, as CI runs them.

Each runs its own small version (no experiment results are read: CONVPROBE_RESULTS
points at an empty directory) and saves its figures as PNG under the test's
temporary directory, where the test checks that they were written. Notebooks are
committed without outputs; `test_notebooks_are_committed_without_outputs` keeps
it so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

#: notebook -> (figures it must write, wall-clock limit in seconds, marks).
CASES = {
    "01-fp16-accumulation.ipynb": (
        ("01-overflow-matrix.png", "01-real-vs-fake.png", "01-ulp-histogram.png"), 600, [pytest.mark.tensorflow],
    ),
    "02-divergence.ipynb": (("02-error-vs-k.png", "02-ulp-histogram.png"), 300, []),
    # Trains three small fp16 ResNets: about 90 s on 2 cores, so it runs under -m slow (the
    # default suite keeps to about 10 minutes; the training it shows is tested in tests/training).
    "03-gradient-underflow.ipynb": (
        ("03-activation-underflow-per-layer.png", "03-weight-underflow-per-layer.png", "03-gradient-histogram.png",
         "03-per-layer-histograms.png"), 900, [pytest.mark.tensorflow, pytest.mark.slow],
    ),
}


def _execute(path: Path, tmp_path: Path, timeout: int) -> nbformat.NotebookNode:
    results, figures = tmp_path / "results", tmp_path / "figures"
    results.mkdir()
    env = {"CONVPROBE_RESULTS": str(results), "CONVPROBE_FIGURES": str(figures), "TF_CPP_MIN_LOG_LEVEL": "2"}
    notebook = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = nbclient.NotebookClient(
            notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}},
        )
        client.execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return notebook


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=marks) for name, (_, _, marks) in CASES.items()]
)
def test_notebook_runs_top_to_bottom(name, tmp_path):
    expected_figures, timeout, _ = CASES[name]
    notebook = _execute(NOTEBOOKS / name, tmp_path, timeout)
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors  # nbclient raises on an error; this keeps the check explicit
    written = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert set(expected_figures) <= set(written), written
    for figure in expected_figures:
        assert (tmp_path / "figures" / figure).stat().st_size > 10_000  # a real image, not an empty canvas
    if name.startswith("01-"):  # the conclusion is computed from this run, switch by switch
        last = [c for c in notebook.cells if c.cell_type == "code"][-1]
        text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
        for switch in ("TF_CONV2D_USE_FP16_ACCUMULATE=1", "The same switch with oneDNN on",
                       "TF_FP16_CONV_USE_FP32_COMPUTE=0 on this CPU", "--xla_cpu_strict_dot_conv_math"):
            assert switch in text, text
        assert "did not run" not in text, text


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_notebooks_are_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name} has saved outputs"
