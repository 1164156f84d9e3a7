"""What `convprobe train` adds to its records for issue 43: TensorBoard event files in the run
directory, the counterfactual-format columns, and an assertion that fails on lost values."""

from __future__ import annotations


import numpy as np
import pytest

from convprobe.testing import assert_no_gradient_underflow
from convprobe.training.config import validate_config
from convprobe.training.records import TELEMETRY_COLUMNS
from convprobe.training.run_loop import train

from .conftest import TINY
from .read_back import events, rows


@pytest.fixture(scope="module")
def unscaled(tmp_path_factory):
    """ResNet-8 at 8x8 without loss scaling: 3 steps, telemetry on steps 0 and 2."""
    out = tmp_path_factory.mktemp("none") / "run"
    train(validate_config(steps=3, record_every=2, loss_scale="none", output=str(out), **TINY), eager=True)
    return out




def test_train_writes_tensorboard_scalars_histograms_and_the_loss_scale(unscaled):
    tags = events(unscaled)
    telemetry = rows(unscaled / "telemetry.csv")
    for row in telemetry:
        base = f"{row['kind']}/{row['layer']}"
        scalar = tags[f"underflow/{base}/flushed_fraction"]
        assert [(s, p) for s, p, _ in scalar] == [(0, "scalars"), (2, "scalars")]
        at_step = {s: float(v) for s, _, v in tags[f"underflow/{base}/subnormal_fraction"]}
        assert at_step[int(row["step"])] == pytest.approx(float(row["subnormal_fraction"]), rel=2**-23)
        histogram = tags[f"log2_abs_grad/{base}"]
        assert {p for _, p, _ in histogram} == {"histograms"}
    assert [(s, float(v)) for s, _, v in tags["loss_scale"]] == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert [float(v) for _, _, v in tags["skipped_steps"]] == [0, 0, 0]


def test_counterfactual_columns_follow_the_formats_ranges(unscaled):
    telemetry = rows(unscaled / "telemetry.csv")
    assert list(telemetry[0]) == list(TELEMETRY_COLUMNS)
    for fmt in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        for what in ("flushed", "subnormal"):
            assert f"{fmt}_{what}_fraction" in telemetry[0]
    e4m3 = np.array([float(r["fp8_e4m3_flushed_fraction"]) for r in telemetry])
    e5m2 = np.array([float(r["fp8_e5m2_flushed_fraction"]) for r in telemetry])
    shadow_fp16 = np.array([float(r["shadow_underflow_fraction"]) for r in telemetry])
    # unscaled gradients: each narrower range flushes at least what a wider one flushes
    assert e4m3.max() > 0 and np.all(e4m3 >= e5m2) and np.all(e5m2 >= shadow_fp16)
    assert all(float(r["bf16_flushed_fraction"]) == 0 for r in telemetry)


def test_the_assertion_fails_when_values_were_lost(unscaled):
    telemetry = rows(unscaled / "telemetry.csv")
    lost, flushed = sum(int(r["lost"]) for r in telemetry), sum(int(r["flushed"]) for r in telemetry)
    assert lost + flushed > 0  # the case: values lost without loss scaling
    with pytest.raises(AssertionError, match="underflowed in"):
        assert_no_gradient_underflow(unscaled, tolerance=0.0)
    if flushed == 0:  # what the old assertion counted: it would have passed
        assert_no_gradient_underflow(unscaled, tolerance=0.0, counting="flushed")
