"""The JAX backend: its conventions are TensorFlow's and the emulator's (integer data, exact in
fp32), each configuration runs in its own process with its switches, and identify names its
arithmetic at a layer on both input sets."""

import pytest

from convprobe.backends.configurations import JAX_MATRIX, matrix_configs, resolve_configs
from convprobe.errors import InvalidArgument

from conftest import assert_conv_ops_match_exact, rows_by_label, run_cli, run_cli_json

pytest.importorskip("jax", reason="the jax extra is not installed (pip install -e '.[jax]')")

from convprobe.backends.jax import JaxBackend  # noqa: E402 - after the skip: it needs JAX

pytestmark = pytest.mark.jax


@pytest.mark.parametrize("padding", ["VALID", "SAME", [(1, 1), (0, 2)]])
@pytest.mark.parametrize("strides,dilation", [(1, 1), (2, 1), (1, 2)])
def test_jax_ops_follow_the_emulators_conventions(padding, strides, dilation):
    assert_conv_ops_match_exact(JaxBackend("cpu"), padding, strides, dilation)


def test_jax_configurations_are_validated_and_carry_their_switches():
    configs = {c.label: c for c in resolve_configs(backend="jax", accumulate="all")}
    assert sorted(configs) == ["jax/cpu/default", "jax/cpu/fp16", "jax/cpu/fp32"]
    assert configs["jax/cpu/fp32"].environment == "preferred_element_type=float32"
    assert configs["jax/cpu/fp16"].env == {"XLA_FLAGS": "--xla_cpu_strict_dot_conv_math=true"}
    assert all(c.isolated for c in configs.values())
    assert [c.name for c in matrix_configs("cpu", "all", "jax")] == list(JAX_MATRIX["cpu"])
    with pytest.raises(InvalidArgument, match="configuration must be one of default, f32-result"):
        matrix_configs("cpu", "jit", "jax")
    with pytest.raises(InvalidArgument, match="precision must be one of default, high, highest; received 'max'"):
        JaxBackend("cpu", precision="max")


def test_the_65519_test_on_jax_names_each_requests_arithmetic_in_its_own_process():
    """Strict XLA rounds each fp16 product (NaN); a float32 result type, and JAX's default on the
    CPU, hold the products wide (0). The switches are in each row."""
    doc = run_cli_json("overflow", "--backend", "jax", "--accumulate", "all")
    rows = rows_by_label(doc)
    assert {label: row["observed"]["output"] for label, row in rows.items()} == {
        "jax/cpu/fp16": ["nan"] * 3, "jax/cpu/fp32": ["0.0"] * 3, "jax/cpu/default": ["0.0"] * 3}
    assert rows["jax/cpu/fp16"]["accumulation"] == "fp16" and rows["jax/cpu/fp32"]["accumulation"] == "fp32"
    assert rows["jax/cpu/fp16"]["runtime"]["xla_flags"] == "--xla_cpu_strict_dot_conv_math=true"
    assert rows["jax/cpu/fp32"]["runtime"]["preferred_element_type"] == "float32"


@pytest.mark.slow
def test_identify_names_jaxs_arithmetic_at_a_layer_on_both_input_sets(tmp_path):
    """Default XLA CPU and strict XLA: every op of a layer at 100% on the U[0, 1) and the signed
    confirmation inputs, through the same general method as TensorFlow's."""
    doc = run_cli_json("identify", "--backend", "jax", "--configs", "default,strict", "--input-shape", "2,6,6,20",
                       "--filter-shape", "3,3,20,8", "--output", str(tmp_path / "jax.json"))
    for label, per_op in doc["matches"].items():
        assert label.startswith("jax/cpu/")
        for op, entry in per_op.items():
            summary = entry["summary"]
            assert summary["stops_matching_at"] is None, (label, op, summary["explanation"])
            assert summary["confirmation"]["fractions"][summary["best"]] == 1.0, (label, op, summary["best"])


def test_study_commands_list_jaxs_matrix():
    proc = run_cli("identify", "--backend", "jax", "--list-configs")
    assert proc.returncode == 0, proc.stderr
    assert "strict+f32-result" in proc.stdout and "preferred_element_type=float32" in proc.stdout
