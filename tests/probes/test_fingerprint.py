"""The fingerprint battery: self-check on the exact emulator (fast, in-process)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from convprobe.backends import EmulatedBackend
from convprobe.emulation import parse_model
from convprobe.errors import InvalidArgument, UnsupportedConfiguration
from convprobe.probes import fingerprint
from convprobe.probes.fingerprint import (
    DISTANCES,
    PROPERTIES,
    battery,
    expected_properties,
    fingerprint_backend,
    infer,
    resolved_size,
    run_battery,
)
from convprobe.probes.fingerprint_ops import OPS, QUADRATIC_OPS, check_ops, reduce_rows

#: Models whose parameters the battery must recover (accumulator, rounding, products,
#: subnormals, overflow, block and chunk sizes), one parameter varied at a time.
SELF_CHECK_MODELS = (
    "sequential:fp16",
    "sequential:fp16:rounding=toward_zero",
    "sequential:fp16:rounding=stochastic:seed=3",
    "sequential:fp16:subnormals=flush",
    "sequential:fp16:overflow=saturate",
    "sequential:fp16:product=fp16",
    "sequential:fp16:product=bf16",
    "sequential:fp16:addition=fp32",
    "sequential:bf16:output=fp16",
    "sequential:fp32:output=fp16",
    "sequential:fp32:output=fp16:rounding=toward_zero",
    "sequential:fp32:output=fp16:subnormals=flush",
    "pairwise:fp16",
    "pairwise:fp32:output=fp16",
    "blocked:fp16:b=2",
    "blocked:fp16:b=4",
    "blocked:fp16:b=8:rounding=nearest_even",
    "blocked:fp16:b=12",
    "blocked:fp16:b=16:extra=3:rounding=nearest_even",
    "v100:output=fp16",
    "a100:output=fp16",
    "h100:output=fp16",
    "chunked:fp16:n=32",
    "chunked:fp16:n=48",
    "chunked:fp16:n=128:rounding=toward_zero",
    "exact:fp64:output=fp16",
    "exact:fp16",
)


@pytest.mark.parametrize("spec", SELF_CHECK_MODELS)
def test_self_check_recovers_every_model_s_parameters(spec):
    model = parse_model(spec)
    assert fingerprint_backend(EmulatedBackend(model), "matmul") == expected_properties(model)


@pytest.mark.parametrize("spec,bits,rounding,block,chunk", [
    ("sequential:fp16", "11", "nearest_even", "1", "n/a"),
    ("sequential:fp16:rounding=toward_zero", "11", "toward_zero", "1", "n/a"),
    ("sequential:fp16:rounding=stochastic:seed=3", "11", "stochastic", "1", "n/a"),
    ("sequential:bf16:output=fp16", "8", "nearest_even", "1", "n/a"),
    ("sequential:fp32:output=fp16", "24", "nearest_even", "n/a", "n/a"),
    ("blocked:fp16:b=4", "11", "toward_zero", "4", "n/a"),
    ("blocked:fp16:b=16:extra=3:rounding=nearest_even", "11", "nearest_even", "16", "n/a"),
    ("a100:output=fp16", "24", "toward_zero", "8", "n/a"),
    ("h100:output=fp16", "24", "toward_zero", "16", "n/a"),
    ("chunked:fp16:n=64", "11", "nearest_even", "1", "64"),
    ("pairwise:fp16", "11", "nearest_even", "tree", "n/a"),
    ("exact:fp64:output=fp16", ">=39", "n/a", "n/a", "n/a"),
])
def test_self_check_names_the_parameters_themselves(spec, bits, rounding, block, chunk):
    got = fingerprint_backend(EmulatedBackend(spec), "matmul")
    assert (got["accumulator_bits"], got["rounding"], got["block_size"], got["chunk_size"]) == (bits, rounding, block, chunk)


def test_extra_alignment_bits_of_a_fused_adder_show_as_adjacent_minus_spread():
    assert fingerprint_backend(EmulatedBackend("a100:output=fp16"), "matmul")["extra_bits"] == "3"
    assert fingerprint_backend(EmulatedBackend("v100:output=fp16"), "matmul")["extra_bits"] == "0"


@pytest.mark.parametrize("op", [op for op in OPS if op not in QUADRATIC_OPS])
@pytest.mark.parametrize("spec", ["sequential:fp16", "blocked:fp16:b=4", "chunked:fp16:n=32:rounding=toward_zero"])
def test_every_op_embedding_reduces_in_index_order_on_the_emulator(op, spec):
    model = parse_model(spec)
    assert fingerprint_backend(EmulatedBackend(model), op) == expected_properties(model)


def test_quadratic_op_skips_the_long_rows_and_says_so():
    got = fingerprint_backend(EmulatedBackend("sequential:fp16"), "conv2d_backprop_input_spatial")
    assert (got["accumulator_bits"], got["rounding"], got["block_size"], got["chunk_size"]) == (
        "11", "nearest_even", "not run", "not run")


def test_cancelling_first_hides_fp16_accumulation():
    outputs = run_battery(EmulatedBackend("sequential:fp16"), "matmul")
    evidence = infer(outputs)["accumulator_bits"]["evidence"]
    assert evidence.endswith("bits by ordering: spread 11, adjacent 11, reversed 11, cancel_first >=39")


def test_battery_is_two_calls_of_fp16_numbers_with_their_own_filters():
    short, long = battery()
    assert (short.name, short.a.shape[1], long.name, long.a.shape[1]) == ("short", 128, "long", 16384)
    for call in (short, long):
        assert call.a.dtype == call.b.dtype == np.float16
        assert call.b.shape == (2, call.a.shape[1])
        assert len(call.rows) == call.a.shape[0] == call.channel.size
        assert np.all(np.isfinite(call.a)) and np.all(np.isfinite(call.b))


def test_resolved_size_pins_powers_of_two_and_brackets_the_rest():
    assert [resolved_size(n) for n in (1, 7, 16, 32, 48, 64, 4096)] == ["1", "7", "16", "32", "(32,63]", "64", "4096"]
    assert all(d in DISTANCES for d in (31, 32, 4095, 4096))


def test_reduce_rows_picks_each_row_s_filter():
    a = np.array([[1, 2, 3], [1, 2, 3]], dtype=np.float16)
    b = np.array([[1, 1, 1], [0, 0, 2]], dtype=np.float16)
    for op in OPS:
        out = reduce_rows(EmulatedBackend("exact:fp64:output=fp16"), op, a, b, np.array([0, 1]))
        assert out.tolist() == [6.0, 6.0], op


def test_ops_are_validated_and_unsupported_ops_reported():
    assert check_ops("all") == OPS
    assert check_ops("matmul,conv2d") == ("matmul", "conv2d")
    with pytest.raises(InvalidArgument, match="op must be one of conv2d, .*; received 'conv4d'"):
        check_ops("conv2d,conv4d")

    class Minimal:
        name, capabilities = "minimal", frozenset({"conv2d"})

    with pytest.raises(UnsupportedConfiguration, match="minimal does not implement matmul"):
        reduce_rows(Minimal(), "matmul", np.ones((1, 2)), np.ones(2))
    observed = fingerprint.run(Minimal(), ops=["matmul"])
    assert observed == {"ops": {"matmul": {"status": "unsupported", "error": "minimal does not implement matmul"}}}


def test_run_output_is_json_and_interprets_like_in_process():
    import json

    observed = json.loads(json.dumps(fingerprint.run(EmulatedBackend("sequential:fp16"), ops=["conv2d", "matmul"])))
    per_op = fingerprint.infer_observed(observed)
    assert {op: r["properties"]["accumulation"]["value"] for op, r in per_op.items()} == {"conv2d": "fp16", "matmul": "fp16"}
    verdict = fingerprint.interpret(observed)
    assert (verdict["accumulation"], verdict["verdict"]) == ("fp16", "conv2d fp16, matmul fp16")
    assert set(per_op["conv2d"]["properties"]) == set(PROPERTIES)


def test_outputs_are_exact_values():
    outputs = run_battery(EmulatedBackend("sequential:fp16"), "matmul")
    assert all(not math.isnan(v) or True for v in outputs["short"])
    assert outputs["short"].dtype == np.float64 and outputs["long"].shape == (len(battery()[1].rows),)
