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
from convprobe.probes.fingerprint import properties
from convprobe.probes.fingerprint.inference import observations
from convprobe.identify.candidates import halving

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
    *(f"{gpu}{out}" for gpu in ("v100", "a100", "ada", "h100", "b200") for out in ("", ":out=fp16")),
    "blocked:fp32:b=12",
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
    ("v100", "24", "toward_zero", "4", "n/a"),
    ("a100", "24", "toward_zero", "8", "n/a"),
    ("h100", "24", "toward_zero", "16", "n/a"),
    ("v100:out=fp16", "11", "nearest_even", "4", "n/a"),
    ("h100:out=fp16", "11", "nearest_even", "16", "n/a"),
    ("blocked:fp32:b=12", "24", "toward_zero", "12", "n/a"),
    ("chunked:fp16:n=64", "11", "nearest_even", "1", "64"),
    ("pairwise:fp16", "11", "nearest_even", "tree", "n/a"),
    ("exact:fp64:output=fp16", ">=39", "n/a", "n/a", "n/a"),
])
def test_self_check_names_the_parameters_themselves(spec, bits, rounding, block, chunk):
    got = fingerprint_backend(EmulatedBackend(spec), "matmul")
    assert (got["accumulator_bits"], got["rounding"], got["block_size"], got["chunk_size"]) == (bits, rounding, block, chunk)


@pytest.mark.parametrize("spec,extra", [("v100", "0"), ("a100", "1"), ("h100", "2"),
                                        ("blocked:fp32:b=8:extra=3", "3"),
                                        ("v100:out=fp16", "13"),  # aligned at fp32: 24 - 11 bits
                                        ("h100:out=fp16", "15")])
def test_extra_alignment_bits_of_a_fused_adder_show_as_adjacent_minus_spread(spec, extra):
    assert fingerprint_backend(EmulatedBackend(spec), "matmul")["extra_bits"] == extra


@pytest.mark.parametrize("op", [op for op in OPS if op not in QUADRATIC_OPS])
@pytest.mark.parametrize("spec", ["sequential:fp16", "chunked:fp16:n=32:rounding=toward_zero"])
def test_every_op_embedding_reduces_in_index_order_on_the_emulator(op, spec):
    """(The block-FMA model's case is in tests/emulation/test_block_fma.py, whose process
    compiles that model's kernel anyway: about 100 s of LLVM on a clean clone.)"""
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


def test_all_ops_together_give_what_each_op_gives_alone():
    backend = EmulatedBackend("blocked:fp16:b=4")
    together = fingerprint.run_all(backend, ["conv2d", "matmul"])
    for op in ("conv2d", "matmul"):
        alone = run_battery(backend, op)
        assert set(together[op]) == set(alone) == {"short", "long"}
        for name in alone:
            assert np.array_equal(together[op][name], alone[name], equal_nan=True)
    assert not math.isnan(together["matmul"]["short"][0])


# -- real TensorFlow: the five configurations the fingerprint must tell apart ------------

from convprobe.backends.configurations import MUST_SHOW, matrix_configs, onednn_runs_fp16  # noqa: E402
from convprobe.probes.fingerprint_ops import CONV2D_OPS  # noqa: E402


@pytest.fixture(scope="session")
def tf_must_show():
    """The battery on conv2d forward and both gradients under the five must-show CPU configurations, once."""
    results = fingerprint.run_grouped(matrix_configs("cpu", list(MUST_SHOW)), {"ops": list(CONV2D_OPS)}, timeout=600)
    table = {}
    for result in results:
        assert result.status == "ok", (result.config.label, result.error)
        for op, entry in fingerprint.infer_observed(result.observed).items():
            assert entry["status"] == "ok", (result.config.label, op, entry["error"])
            table[(result.config.name, op)] = {k: v["value"] for k, v in entry["properties"].items()}
    return table


FP32 = ("fp32", "24", "exact", "0 (wide or fused)")
FP16 = ("fp16", "11", "exact", "inf (fp16 fused chain)")


#: The Eigen kernels (oneDNN off), op by op.
EIGEN = {
    "conv2d": FP32,
    "conv2d_spatial": FP32,
    "conv2d_backprop_input": ("fp16 in 8 lanes, summed in fp32", "11", "11", "NaN (fp16 products)"),
    "conv2d_backprop_input_spatial": ("fp16, products to 11 bits", "11", "11", "NaN (fp16 products)"),
    "conv2d_backprop_filter": FP16,
}


@pytest.mark.tensorflow
@pytest.mark.parametrize("config,op,expected", [
    # oneDNN's f16 kernels accumulate in fp32; a CPU it cannot run fp16 on gets the Eigen kernels
    *[("default", op, FP32 if onednn_runs_fp16() else EIGEN[op]) for op in CONV2D_OPS],
    *[("onednn-off", op, expected) for op, expected in EIGEN.items()],
    ("onednn-off+fp16-acc", "conv2d", FP16),
    ("onednn-off+fp16-acc", "conv2d_spatial", FP16),
    ("onednn-off+fp16-acc", "conv2d_backprop_filter", FP16),
    *[("jit", op, FP32) for op in CONV2D_OPS],
    *[("jit+strict", op, FP16) for op in CONV2D_OPS],
])
def test_tensorflow_cpu_configurations_are_told_apart(tf_must_show, config, op, expected):
    got = tf_must_show[(config, op)]
    assert (got["accumulation"], got["accumulator_bits"], got["product_bits"], got["product_overflow"]) == expected


@pytest.mark.tensorflow
def test_the_default_configuration_is_the_eigen_one_exactly_where_onednn_cannot_run_fp16(tf_must_show):
    """TensorFlow hands fp16 ops to oneDNN only on some CPUs; elsewhere every property of
    every op under `default` is the oneDNN-off one, and where it does the gradients differ."""
    same = [tf_must_show[("default", op)] == tf_must_show[("onednn-off", op)] for op in CONV2D_OPS]
    if onednn_runs_fp16():
        assert not all(same)
    else:
        assert all(same)


@pytest.mark.tensorflow
def test_strict_xla_is_a_sequential_fp16_chain_rounding_to_nearest(tf_must_show):
    for op in ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"):
        got = tf_must_show[("jit+strict", op)]
        assert (got["block_size"], got["rounding"], got["accumulator_range"], got["overflow"]) == ("1", "nearest_even", "fp16", "inf")
        # each fp16 addition is done in fp32 and rounded back: a sum just below a tie lands on it
        assert got["double_rounding"] == "yes"


@pytest.mark.tensorflow
def test_xla_fp32_reduction_interleaves_four_lanes(tf_must_show):
    assert tf_must_show[("jit", "conv2d")]["block_size"] == "lanes=4"
    assert tf_must_show[("default", "conv2d")]["block_size"] == "n/a"


@pytest.mark.slow
@pytest.mark.tensorflow
def test_full_matrix_every_op_runs_and_gpu_switches_change_nothing_on_cpu():
    from convprobe.probes.fingerprint_ops import OPS

    configs = matrix_configs("cpu", "all")
    results = {r.config.name: r for r in fingerprint.run_grouped(configs, {"ops": list(OPS)}, timeout=900)}
    assert all(r.status == "ok" for r in results.values())
    props = {name: fingerprint.infer_observed(r.observed) for name, r in results.items()}
    assert props["gpu-switches"] == props["default"]  # the cuDNN/cuBLAS switches do nothing on a CPU
    if onednn_runs_fp16():  # the Eigen switch does nothing while oneDNN runs the op
        assert props["fp16-acc"] == props["default"]
    else:  # the Eigen kernels run, and the switch makes their conv2d accumulate in fp16
        assert props["fp16-acc"] == props["onednn-off+fp16-acc"]
    for op in OPS:
        assert props["jit+strict+no-excess"][op]["properties"]["accumulation"]["value"] == "fp16"


@pytest.mark.parametrize("width", [4, 8, 16])
def test_narrow_lanes_summed_wide_are_named_from_the_lane_rows(width):
    """fp16 SIMD lanes with an fp32 horizontal sum (TensorFlow's oneDNN-off input gradient):
    each lane is measured on its own, and the label says both formats."""
    model = f"lanes({width}, sequential:fp16:addition=fp32, combine={halving(width).to_spec()})"
    got = fingerprint_backend(EmulatedBackend(model), "matmul")
    assert got["accumulation"] == f"fp16 in {width} lanes, summed in fp32"
    assert (got["accumulator_bits"], got["rounding"], got["block_size"]) == ("11", "nearest_even", f"lanes={width}")


def test_lanes_wider_than_the_stride_or_summed_narrow_are_not_taken_for_narrow_lanes():
    """32 lanes cannot be measured in one lane (terms 16 apart); fp16 lanes summed in fp16 keep 11 bits
    in every ordering, so no lane is narrower than their sum."""
    outputs = fingerprint.run_battery(EmulatedBackend(f"lanes(32, sequential:fp16, combine={halving(32).to_spec()})"), "matmul")
    assert properties.lanes(observations(outputs)).value == 32  # seen, but not measurable in one lane
    assert "lanes" not in infer(outputs)["accumulation"]["value"]
    narrow = fingerprint_backend(EmulatedBackend("lanes(8, sequential:fp16, combine=sequential:fp16)"), "matmul")
    assert "lanes" not in narrow["accumulation"] and narrow["accumulator_bits"] == "11"
