"""identify: the emulator must be recognised as itself, bit for bit, at every K."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli_json

from convprobe.backends import EmulatedBackend
from convprobe.emulation import dot, parse_model
from convprobe.errors import InvalidArgument
from convprobe.identify import battery
from convprobe.identify.battery import (
    DEFAULT_CANDIDATES,
    DEFAULT_KS,
    identify_backend,
    inputs,
    parse_candidate,
    summarize_matches,
)


def test_default_ks_run_from_16_to_8192():
    assert DEFAULT_KS[0] == 16 and DEFAULT_KS[-1] == 8192 and len(DEFAULT_KS) == 10


def test_conv2d_is_identified_up_to_16384_by_default():
    assert battery.default_ks("conv2d") == battery.default_ks("conv2d_spatial") == DEFAULT_KS + (16384,)
    assert battery.default_ks("matmul") == battery.default_ks("conv2d_backprop_filter") == DEFAULT_KS
    assert battery.battery_ks(["matmul"]) == list(DEFAULT_KS)
    assert battery.battery_ks(["conv2d_backprop_input_spatial"])[-1] == 1024  # quadratic in K: capped
    assert battery.battery_ks(["matmul", "conv2d"]) == [*DEFAULT_KS, 16384]
    assert battery.battery_ks(["matmul", "conv2d"], ks=[64, 16384]) == [64, 16384]  # asked for: as asked


def test_a_default_run_measures_each_op_at_its_own_ks():
    observed = battery.run(EmulatedBackend("sequential:fp16"), ops=["conv2d", "matmul"], rows=8, measure=False)
    assert observed["ks"] == [*DEFAULT_KS, 16384]
    assert list(observed["ops"]["conv2d"]["bits"]) == [str(k) for k in (*DEFAULT_KS, 16384)]
    assert list(observed["ops"]["matmul"]["bits"]) == [str(k) for k in DEFAULT_KS]
    summary = battery.identify_observed(observed, ["sequential:fp16", "pairwise:fp16"])["conv2d"]["summary"]
    assert summary["best"] == "sequential:fp16" and summary["fractions"][16384] == 1.0
    assert summary["direct_per_k"][16384]["direct"] is True


@pytest.mark.parametrize("spec", [
    "sequential:fp16",
    "sequential:fp32:output=fp16",
    "sequential:fp16:product=fp16",
    "pairwise:fp16",
    "pairwise:fp32:output=fp16",
    "chunked:fp16:n=64",
    "blocked:fp16:b=8",
    "blocked:fp32:b=8:extra=3:output=fp16",
    "exact:fp64:output=fp16",
])
def test_identify_on_the_emulator_recovers_the_model_it_was_given(spec):
    result = identify_backend(EmulatedBackend(spec), "matmul", measure=False)  # the family alone
    summary = result["summary"]
    assert summary["best"] == spec
    assert summary["perfect"] == [spec]  # no other candidate reproduces it at every K
    assert summary["stops_matching_at"] is None
    assert summary["fractions"] == {k: 1.0 for k in DEFAULT_KS}


def test_identify_through_conv2d_recovers_the_model_too():
    result = identify_backend(EmulatedBackend("chunked:fp16:n=32"), "conv2d", ks=(16, 64, 256), measure=False)
    assert result["summary"]["best"] == "chunked:fp16:n=32"
    assert result["summary"]["fractions"] == {16: 1.0, 64: 1.0, 256: 1.0}


def test_a_model_outside_the_family_is_matched_only_up_to_where_it_differs():
    # chunks of 4096 in fp16 (not a candidate) are sequential fp16 for K <= 4096: the best stops there
    result = identify_backend(EmulatedBackend("chunked:fp16:n=4096"), "matmul", ks=(64, 1024, 4096, 8192),
                              measure=False)
    summary = result["summary"]
    assert summary["best"] == "sequential:fp16"
    assert summary["stops_matching_at"] == 8192
    assert [summary["fractions"][k] for k in (64, 1024, 4096)] == [1.0, 1.0, 1.0]
    assert summary["fractions"][8192] < 1.0


@pytest.mark.parametrize("spec,k", [
    ("chunked:fp16:n=4096", 8192),  # outside the family: the K's own measured model finds it
    ("splitk(length=2048, splitk(length=320, sequential:fp16:addition=fp32, combine=fp16), combine=fp16)", 4096),
    ("splitk(length=320, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)", 1024),
])
def test_each_k_gets_its_own_measured_model(spec, k):
    summary = identify_backend(EmulatedBackend(spec), "matmul", ks=(64, k))["summary"]
    measured = [parse_model(m).to_spec() for m in summary["per_k"][k]["measured"]]
    assert parse_model(spec).to_spec() in measured, summary["per_k"][k]
    assert summary["per_k"][k]["fraction"] == 1.0 and summary["per_k"][64]["fraction"] == 1.0
    assert summary["fractions"][k] < 1.0  # no single model of the family does it


def test_lane_candidates_deal_terms_round_robin():
    cand = parse_candidate("lanes:fp16:w=4:then=pairwise")
    a, filters = inputs(0, 64, rows=6)
    b = filters[np.arange(6) % len(filters)]
    lanes = np.stack([dot(a[:, i::4], b[:, i::4], parse_model("sequential:fp16")) for i in range(4)], axis=1)
    expected = dot(lanes, np.ones((1, 4), dtype=np.float16), parse_model("pairwise:fp16"))
    assert np.array_equal(cand.compute(a, b).view(np.uint16), expected.astype(np.float16).view(np.uint16))
    # K need not be a multiple of the width: lanes 0 and 1 get two terms, lanes 2 and 3 one
    ones = np.ones((1, 6), np.float16)
    assert float(cand.compute(ones, np.ones(6, np.float16))[0]) == 6.0


@pytest.mark.parametrize("spec,message", [
    ("lanes:fp16", "lane model must look like"),
    ("lanes:fp16:w=x", "lane model w must be a positive integer"),
    ("lanes:fp16:w=4:then=tree", "then must be one of sequential, pairwise; received 'tree'"),
    ("lanes:fp16:w=4:size=3", "lane model parameter must be one of w, then, product; received 'size'"),
    ("lanes:fp16:w=0", "width must be an integer >= 1; received 0"),
    ("sequentail:fp16", "model must be one of"),
])
def test_bad_candidates_are_invalid_arguments(spec, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_candidate(spec)


def test_every_default_candidate_parses_and_names_itself():
    names = [c.name for c in battery.candidates()]
    assert names == list(DEFAULT_CANDIDATES) and len(set(names)) == len(names)


def test_inputs_are_seeded_and_carry_offset_rows():
    a1, b1 = inputs(7, 32)
    a2, b2 = inputs(7, 32)
    assert b1.shape == (battery.CHANNELS, 32)
    assert np.array_equal(a1.view(np.uint16), a2.view(np.uint16)) and np.array_equal(b1.view(np.uint16), b2.view(np.uint16))
    third = a1.shape[0] // 3
    assert np.all(a1[-third:, 0] >= 2.0**15) and np.array_equal(a1[-third:, -1], -a1[-third:, 0])
    assert np.all(b1[:, 0] == 1.0) and np.all(b1[:, -1] == 1.0)
    assert not np.array_equal(inputs(8, 32)[0], a1)


def test_summary_prefers_the_earlier_of_equal_candidates_and_finds_the_stop():
    table = {"simple": {16: 1.0, 32: 0.5}, "complex": {16: 1.0, 32: 0.5}, "worse": {16: 0.0, 32: 0.0}}
    assert summarize_matches(table) == {"best": "simple", "fractions": {16: 1.0, 32: 0.5},
                                        "stops_matching_at": 32, "perfect": []}


def test_run_is_json_and_interpret_names_the_model():
    observed = json.loads(json.dumps(battery.run(EmulatedBackend("sequential:fp16"), ops=["matmul"], ks=(16, 32))))
    assert set(observed["ops"]["matmul"]["bits"]) == {"16", "32"}
    verdict = battery.interpret(observed)
    assert verdict["accumulation"] == "fp16"
    assert verdict["verdict"] == "matmul: sequential:fp16 (matches at every K; K=16: 100.0%, K=32: 100.0%)"


@pytest.mark.slow
@pytest.mark.tensorflow
def test_identify_names_a_model_for_each_tensorflow_cpu_configuration():
    """Measured on an AVX512-FP16 CPU with TensorFlow 2.21 (see the report in the issue); on a
    CPU where oneDNN cannot run fp16, `default` is the Eigen configuration (`onednn_runs_fp16`)."""
    from convprobe.backends.configurations import MUST_SHOW, matrix_configs, onednn_runs_fp16
    from convprobe.probes.runner import run_probe

    results = run_probe(battery.__name__, matrix_configs("cpu", list(MUST_SHOW)),  # by path, as battery_study runs it
                        {"ops": ["conv2d", "conv2d_backprop_filter"], "ks": list(DEFAULT_KS), "rows": 64, "seed": 0},
                        timeout=900, name="identify")
    found = {}
    for result in results:
        assert result.status == "ok", result.error
        for op, entry in battery.identify_observed(result.observed).items():
            found[(result.config.name, op)] = entry["summary"]
    assert found[("jit", "conv2d")]["best"] == "lanes:fp32:w=4:then=sequential"
    assert found[("jit", "conv2d")]["stops_matching_at"] is None
    strict = found[("jit+strict", "conv2d")]
    assert strict["best"].startswith(("sequential:fp16", "chunked:fp16"))
    # one fp16 chain up to K = 512 on every CPU measured; at 1024 Eigen's blocking depends on the
    # machine (one chain with a 48 KiB L1d, chunks of 520 with 32 KiB: docs/battery-models-zen4.md)
    assert all(strict["fractions"][k] == 1.0 for k in DEFAULT_KS if k <= 512)
    default = found[("default", "conv2d")]
    assert default["best"] == "sequential:fp32:output=fp16"
    if onednn_runs_fp16():  # oneDNN's fp32 chain
        assert all(default["fractions"][k] == 1.0 for k in DEFAULT_KS if k <= 4096)
    else:  # Eigen's fp32 GEMM, whose chunks depend on K and the machine (docs/battery-models-zen4.md): onednn-off's bits
        assert default["fractions"] == found[("onednn-off", "conv2d")]["fractions"]
    for key, summary in found.items():
        assert set(summary["fractions"]) == set(DEFAULT_KS)
        assert all(e["fraction"] == 1.0 for e in summary["per_k"].values()), (key, summary["per_k"])


@pytest.mark.slow
@pytest.mark.tensorflow
def test_the_ks_own_measured_model_reproduces_tensorflow_where_no_single_model_does():
    """oneDNN off + fp16 accumulation: beyond K = 1024 no model of the family matches
    (the kernel's chunks and its thread split change with K); the model measured at each K
    does, bit for bit."""
    doc = run_cli_json("identify", "--configs", "onednn-off+fp16-acc", "--op", "conv2d,einsum",
                       "--ks", "2048,8192", "--threads", "2")
    for op, entry in doc["matches"]["tensorflow/cpu/onednn-off+fp16-acc"].items():
        summary = entry["summary"]
        assert min(summary["fractions"].values()) < 0.99, (op, summary["fractions"])
        assert {k: e["fraction"] for k, e in summary["per_k"].items()} == {"2048": 1.0, "8192": 1.0}, op
        assert summary["per_k"]["8192"]["best"].startswith("splitk(length=4096, "), summary["per_k"]["8192"]


@pytest.mark.slow
def test_the_cli_battery_runs_conv2d_to_16384_and_matmul_to_8192_by_default():
    doc = run_cli_json("identify", "--configs", "none", "--model", "sequential:fp16", "--op", "conv2d,matmul",
                       "--rows", "2")
    matches = doc["matches"]["emulated/sequential:fp16"]
    assert list(matches["conv2d"]["summary"]["fractions"]) == [str(k) for k in (*DEFAULT_KS, 16384)]
    assert list(matches["matmul"]["summary"]["fractions"]) == [str(k) for k in DEFAULT_KS]
    assert doc["params"]["ks"] is None  # each op's default (battery.default_ks)
    assert doc["params"]["ks_by_op"] == {"conv2d": [*DEFAULT_KS, 16384], "matmul": list(DEFAULT_KS)}


def test_the_document_says_which_ks_each_op_ran_at():
    doc = run_cli_json("identify", "--configs", "none", "--model", "sequential:fp16",
                       "--op", "matmul,conv2d_backprop_input_spatial", "--ks", "16,2048", "--rows", "2")
    assert doc["params"]["ks"] == [16, 2048]
    ks_by_op = doc["params"]["ks_by_op"]
    assert ks_by_op == {"matmul": [16, 2048], "conv2d_backprop_input_spatial": [16]}  # quadratic in K: capped
    for op, entry in doc["matches"]["emulated/sequential:fp16"].items():
        assert [int(k) for k in entry["summary"]["fractions"]] == ks_by_op[op], op
