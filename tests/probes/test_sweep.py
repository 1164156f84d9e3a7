"""sweep: error versus K on the emulator, as a tidy table with bounds and flags."""

from __future__ import annotations

import numpy as np
import pytest

from convprobe.analysis.tables import SWEEP_SCHEMA, add_bounds, frame_from_records
from convprobe.backends.configurations import emulated_config
from convprobe.errors import InvalidArgument
from convprobe.probes import fingerprint_ops, layers, sweep
from convprobe.probes.runner import run_probe


@pytest.fixture(scope="module")
def frame():
    configs = [emulated_config(m)
               for m in ("sequential:fp16", "sequential:fp32:output=fp16", "blocked:fp16:b=8")]
    results = run_probe("sweep", configs, {"ops": ["conv2d"], "seed": 0}, jobs=1)
    records = [r for result in results for r in sweep.records(result, 0)]
    return add_bounds(frame_from_records(records, "sweep"), "fp16")


def test_default_ks_run_from_9_past_16384():
    assert sweep.DEFAULT_KS[0] == 9 and sweep.DEFAULT_KS[-1] == 18432 >= 16384


def test_one_row_per_configuration_distribution_and_k(frame):
    assert list(frame.columns) == list(SWEEP_SCHEMA.names)
    assert len(frame) == 3 * len(sweep.DISTRIBUTIONS) * len(sweep.DEFAULT_KS)
    assert set(frame["status"]) == {"ok"} and set(frame["n"]) == {sweep.DEFAULT_ROWS}


def _at(frame, config, dist, k):
    row = frame[(frame["configuration"] == f"emulated/{config}") & (frame["distribution"] == dist) & (frame["k"] == k)]
    assert len(row) == 1
    return row.iloc[0]


def test_fp16_sums_stagnate_and_exceed_the_probabilistic_bound_fp32_ones_do_not(frame):
    fp16 = _at(frame, "sequential:fp16", "uniform01", 18432)
    fp32 = _at(frame, "sequential:fp32:output=fp16", "uniform01", 18432)
    assert bool(fp16["stagnated"]) and bool(fp16["exceeds_probabilistic"])
    assert not bool(fp32["stagnated"]) and not bool(fp32["exceeds_probabilistic"])
    assert fp32["max_abs_sum_error"] <= 2.0**-11  # one fp16 output rounding, u16 = 2**-11
    assert not _at(frame, "sequential:fp16", "uniform01", 9)["stagnated"]


def test_stagnation_is_undefined_for_mixed_signs(frame):
    assert frame[frame["distribution"] != "uniform01"]["stagnated"].isna().all()


def test_blocked_truncation_exceeds_the_bound_much_earlier_than_round_to_nearest(frame):
    def first_exceeding(config):
        rows = frame[(frame["configuration"] == f"emulated/{config}") & (frame["distribution"] == "uniform01")]
        return int(rows[rows["exceeds_probabilistic"].astype(bool)]["k"].min())

    assert first_exceeding("blocked:fp16:b=8") < first_exceeding("sequential:fp16")


def test_inputs_are_seeded_per_distribution():
    a, b = sweep.inputs("normal", 3, 9, rows=4)
    a2, b2 = sweep.inputs("normal", 3, 9, rows=4)
    assert a.dtype == np.float16 and np.array_equal(a.view(np.uint16), a2.view(np.uint16))
    assert not np.array_equal(sweep.inputs("uniform11", 3, 9, rows=4)[0], a)
    heavy, _ = sweep.inputs("heavy_tailed", 0, 4096, rows=8)
    assert np.abs(heavy).max() <= sweep.HEAVY_CLIP


def test_distributions_are_validated():
    assert sweep.check_distributions("all") == sweep.DISTRIBUTIONS
    with pytest.raises(InvalidArgument, match="distribution must be one of uniform01, .*; received 'cauchy'"):
        sweep.check_distributions("normal,cauchy")


def test_failed_configurations_keep_their_row():
    results = run_probe("sweep", [emulated_config("sequential:fp16")],
                        {"ops": ["conv2d"], "ks": [9], "distributions": ["normal"], "rows": 2, "seed": 0}, jobs=1)
    results[0].status, results[0].error = "crashed", "child exited"
    rows = sweep.records(results[0], 0)
    assert [(r["status"], r["detail"], r["op"]) for r in rows] == [("crashed", "child exited", "-")]


@pytest.mark.parametrize(("names", "seeds"), [
    (sweep.DISTRIBUTIONS, sweep.DISTRIBUTION_SEEDS),
    (fingerprint_ops.OPS, fingerprint_ops.BATTERY_OP_SEEDS),
    ((*layers.LAYER_OPS, *layers.DEPTHWISE_OPS), layers.OP_SEEDS),
])
def test_every_seeded_name_has_its_own_stream_keyed_by_name_not_position(names, seeds):
    """Seeded inputs hang on a name's own number, so adding or reordering a name changes no
    other's inputs."""
    assert set(seeds) == set(names), sorted(set(seeds) ^ set(names))
    assert len(set(seeds.values())) == len(seeds), seeds
