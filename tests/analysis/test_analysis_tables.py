"""Tidy tables: fixed schemas, validation errors that name the problem, lossless files."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from convprobe.analysis import summarize
from convprobe.analysis.tables import (
    PROBE_SCHEMA,
    STATUSES,
    SWEEP_SCHEMA,
    TABLE_SCHEMA_VERSION,
    add_bounds,
    empty_frame,
    fingerprint_table,
    frame_from_records,
    read_table,
    validate_frame,
    write_table,
)
from convprobe.errors import InvalidArgument

U16 = 2.0**-11
BASE = {"backend": "emulated", "configuration": "fp16-sequential", "device": "cpu", "op": "conv2d",
        "format": "fp16", "distribution": "uniform01", "seed": 0}


def _sweep_rows() -> list[dict]:
    rng = np.random.default_rng(1)
    reference = rng.random(64)
    actual = reference.astype(np.float16)
    ok = {**BASE, "k": 9, "status": "ok", **summarize(actual, reference, "fp16"), "max_abs_sum_error": 2.0**-12}
    bad = {**BASE, "k": 4096, "status": "ok", "max_abs_sum_error": 0.25, "max_ulp_error": math.inf}
    crashed = {**BASE, "k": 16384, "status": "crashed", "detail": "child killed by SIGSEGV"}
    return [ok, bad, crashed]


def _probe_rows() -> list[dict]:
    common = {"backend": "tensorflow", "device": "cpu", "probe": "fingerprint"}
    return [
        {**common, "configuration": "default", "op": "conv2d", "property": "accumulation", "value": "fp32", "status": "ok"},
        {**common, "configuration": "default", "op": "conv2d", "property": "block_size", "value": "1", "status": "ok",
         "evidence": "+p/-p cancel at every distance"},
        {**common, "configuration": "onednn-off", "op": "conv2d", "property": "accumulation", "value": "fp16", "status": "ok"},
        {**common, "configuration": "xla-strict", "op": "conv2d", "property": "accumulation", "value": "",
         "status": "crashed", "detail": "SIGABRT"},
    ]


def test_sweep_schema_holds_every_summarize_key():
    keys = set(summarize([1.0], [1.0], "fp16"))
    assert keys <= set(SWEEP_SCHEMA.names)
    assert SWEEP_SCHEMA.version == PROBE_SCHEMA.version == TABLE_SCHEMA_VERSION
    assert set(SWEEP_SCHEMA.required) == {"schema_version", "backend", "configuration", "device", "op",
                                           "format", "distribution", "k", "seed", "status"}
    assert STATUSES == ("ok", "unsupported", "failed", "crashed", "timeout")


def test_frame_from_records_fills_version_and_leaves_crashed_metrics_empty():
    df = frame_from_records(_sweep_rows(), SWEEP_SCHEMA)
    assert list(df.columns) == list(SWEEP_SCHEMA.names)
    assert df["schema_version"].tolist() == [1, 1, 1]
    assert df["k"].dtype == "Int64" and df["max_ulp_error"].dtype == np.float64
    assert df.loc[2, "max_ulp_error"] != df.loc[2, "max_ulp_error"]  # NaN: a crashed row has no metrics
    assert df.loc[1, "max_ulp_error"] == math.inf
    assert df.loc[0, "fraction_correctly_rounded"] == 1.0
    assert empty_frame("sweep").shape == (0, len(SWEEP_SCHEMA.names))
    assert frame_from_records([], "probe").shape == (0, len(PROBE_SCHEMA.names))


def test_frame_from_records_names_unknown_and_missing_columns():
    with pytest.raises(InvalidArgument, match="record 0 has unknown column.s. max_ulps for the sweep schema v1"):
        frame_from_records([{**BASE, "k": 9, "status": "ok", "max_ulps": 1.0}], "sweep")
    with pytest.raises(InvalidArgument, match="record 1 is missing required column.s. k, status of the sweep schema"):
        frame_from_records([{**BASE, "k": 9, "status": "ok"}, BASE], "sweep")
    with pytest.raises(InvalidArgument, match="schema must be one of sweep, probe; received 'sweeps'"):
        frame_from_records([], "sweeps")


def test_validate_frame_errors_name_the_problem():
    df = frame_from_records(_sweep_rows(), "sweep")
    with pytest.raises(InvalidArgument, match="missing column.s. seed; unknown column.s. colour"):
        validate_frame(df.drop(columns=["seed"]).assign(colour="red"), "sweep")
    with pytest.raises(InvalidArgument, match="table has schema_version 2; this convprobe reads sweep schema v1"):
        validate_frame(df.assign(schema_version=2), "sweep")
    with pytest.raises(InvalidArgument, match="table: status must be one of ok, unsupported, failed, crashed, timeout; received 'boom'"):
        validate_frame(df.assign(status="boom"), "sweep")
    with pytest.raises(InvalidArgument, match="column k must hold int values"):
        validate_frame(df.assign(k=[9, 4096.5, 16384]), "sweep")
    with pytest.raises(InvalidArgument, match="required column configuration is empty in row 1"):
        validate_frame(df.assign(configuration=["a", None, "c"]), "sweep")


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_tables_round_trip_through_files_losslessly(tmp_path, suffix):
    df = add_bounds(frame_from_records(_sweep_rows(), "sweep"))
    path = write_table(df, tmp_path / f"sweep{suffix}", "sweep")
    back = read_table(path, "sweep")
    pd.testing.assert_frame_equal(back, df)
    probes = frame_from_records(_probe_rows(), PROBE_SCHEMA)
    path = write_table(probes, tmp_path / f"probes{suffix}", "probe")
    pd.testing.assert_frame_equal(read_table(path, "probe"), probes)


def test_read_table_refuses_foreign_files(tmp_path):
    probes = frame_from_records(_probe_rows(), "probe")
    write_table(probes, tmp_path / "p.csv", "probe")
    write_table(probes, tmp_path / "p.json", "probe")
    with pytest.raises(InvalidArgument, match="results file p.csv does not match the sweep schema v1: missing column.s. format"):
        read_table(tmp_path / "p.csv", "sweep")
    with pytest.raises(InvalidArgument, match="results file p.json holds a 'probe' table, not 'sweep'"):
        read_table(tmp_path / "p.json", "sweep")
    (tmp_path / "v2.json").write_text(json.dumps({"schema": "probe", "rows": [{**r, "schema_version": 2} for r in (
        json.loads((tmp_path / "p.json").read_text())["rows"])]}))
    with pytest.raises(InvalidArgument, match="results file v2.json has schema_version 2"):
        read_table(tmp_path / "v2.json", "probe")
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    rows[-1]["colour"] = "red"  # one row with an extra key is enough to refuse the file
    (tmp_path / "extra.json").write_text(json.dumps({"schema": "probe", "rows": rows}))
    with pytest.raises(InvalidArgument, match="results file extra.json does not match the probe schema v1: unknown column.s. colour"):
        read_table(tmp_path / "extra.json", "probe")
    (tmp_path / "records.json").write_text(json.dumps([{"probe": "overflow"}]))
    with pytest.raises(InvalidArgument, match="results file records.json is not a convprobe table"):
        read_table(tmp_path / "records.json", "probe")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(InvalidArgument, match="results file junk.json is not valid JSON"):
        read_table(tmp_path / "junk.json", "probe")
    with pytest.raises(InvalidArgument, match="does not exist"):
        read_table(tmp_path / "missing.csv", "probe")
    with pytest.raises(InvalidArgument, match="path suffix must be one of .csv, .json; received '.parquet'"):
        write_table(probes, tmp_path / "p.parquet", "probe")


def test_add_bounds_values_and_flags():
    df = add_bounds(frame_from_records(_sweep_rows(), "sweep"), "fp16", lam=2.0)
    assert df["bound_format"].tolist() == ["fp16"] * 3
    # closed forms (Higham's gamma_K = K u / (1 - K u), lambda sqrt(K) u), not the bounds module;
    # a few float64 roundings apart at most
    close = dict(rel=4 * 2.0**-53)
    assert df.loc[0, "gamma_bound"] == pytest.approx(9 * U16 / (1 - 9 * U16), **close)
    assert math.isnan(df.loc[1, "gamma_bound"])  # 4096 * 2**-11 >= 1: gamma gives no information
    assert df["probabilistic_bound"].tolist() == pytest.approx(
        [2.0 * math.sqrt(k) * U16 for k in (9, 4096, 16384)], **close)
    assert df.loc[2, "probabilistic_bound"] == 2.0 * 128 * U16
    assert df["exceeds_probabilistic"].tolist() == [False, True, pd.NA]
    with_output = add_bounds(frame_from_records(_sweep_rows(), "sweep"), "fp32", output="fp16")
    u32 = 2.0**-24
    assert with_output.loc[0, "gamma_bound"] == pytest.approx(
        U16 + (1 + U16) * 9 * u32 / (1 - 9 * u32), **close)


def test_add_bounds_leaves_rows_of_failed_runs_and_empty_tables_without_bounds():
    """A crashed configuration's row has k = 0 (nothing measured): no bound, no error."""
    crashed = {**BASE, "configuration": "gone", "k": 0, "status": "crashed", "detail": "SIGABRT"}
    df = add_bounds(frame_from_records([*_sweep_rows(), crashed], "sweep"), "fp16")
    assert math.isnan(df.loc[3, "gamma_bound"]) and math.isnan(df.loc[3, "probabilistic_bound"])
    assert df.loc[0, "probabilistic_bound"] > 0 and df.loc[3, "exceeds_probabilistic"] is pd.NA
    assert add_bounds(empty_frame("sweep"), "fp16").shape == (0, len(SWEEP_SCHEMA.names))


def test_fingerprint_table_pivots_and_keeps_crashed_rows():
    table = fingerprint_table(frame_from_records(_probe_rows(), "probe"))
    assert table.to_dict(orient="records") == [
        {"configuration": "default", "op": "conv2d", "accumulation": "fp32", "block_size": "1"},
        {"configuration": "onednn-off", "op": "conv2d", "accumulation": "fp16", "block_size": "-"},
        {"configuration": "xla-strict", "op": "conv2d", "accumulation": "crashed", "block_size": "crashed"},
    ]
    chosen = fingerprint_table(frame_from_records(_probe_rows(), "probe"), properties=["block_size"])
    assert list(chosen.columns) == ["configuration", "op", "block_size"]
