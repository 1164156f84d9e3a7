import dataclasses

import pytest

from convprobe.backends.jax import jax_installed
from convprobe.backends.pytorch import torch_installed
from convprobe.backends.configurations import (
    MANAGED_VARIABLES, SETTINGS, BackendConfig, TensorFlowConfig, emulated_config, gpu_visible, parse_env_assignments,
    matrix_rows, onednn_runs_fp16, resolve_configs, resolve_device,
)
from convprobe.backends.isolation import child_environment
from convprobe.errors import InvalidArgument


def test_cpu_fp16_request_maps_to_the_eigen_fp16_accumulation_switches():
    (config,) = resolve_configs(backend="tensorflow", accumulate="fp16", device="cpu")
    assert config.env == {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1"}
    assert config.label == "tensorflow/cpu/fp16"


def test_gpu_requests_map_to_the_cudnn_compute_type_switch():
    assert SETTINGS[("gpu", "fp16")].env["TF_FP16_CONV_USE_FP32_COMPUTE"] == "0"
    assert SETTINGS[("gpu", "fp32")].env["TF_FP16_CONV_USE_FP32_COMPUTE"] == "1"
    assert SETTINGS[("gpu", "default")].env == {} and SETTINGS[("cpu", "default")].env == {}


def test_all_expands_to_one_config_per_backend_and_request():
    """'all' is every installed framework: JAX's and PyTorch's rows where their extras are installed."""
    labels = [c.label for c in resolve_configs(backend="all", accumulate="all", device="cpu")]
    assert labels == [
        "tensorflow/cpu/fp16", "tensorflow/cpu/fp32", "tensorflow/cpu/default",
        "emulated/sequential:fp16", "emulated/sequential:fp32", "emulated/sequential:fp32 (default)",
        *(["jax/cpu/fp16", "jax/cpu/fp32", "jax/cpu/default"] if jax_installed() else []),
        *(["torch/cpu/fp16", "torch/cpu/fp32", "torch/cpu/default"] if torch_installed() else []),
    ]


def test_user_env_is_added_on_top_of_the_table():
    (config,) = resolve_configs(backend="tensorflow", accumulate="fp32",
                                extra_env=parse_env_assignments(["TF_CONV2D_USE_FP16_ACCUMULATE=1", "X=a=b"]))
    assert config.env["TF_CONV2D_USE_FP16_ACCUMULATE"] == "1" and config.env["X"] == "a=b"


@pytest.mark.parametrize("kwargs,message", [
    ({"accumulate": "fp8"}, "accumulate must be one of fp16, fp32, default, all; received 'fp8'"),
    ({"backend": "mxnet"}, "backend must be one of tensorflow, emulated, jax, torch, all; received 'mxnet'"),
    ({"device": "tpu"}, "device must be one of cpu, gpu, auto; received 'tpu'"),
    ({"backend": "tensorflow", "model": "sequential:fp16"}, "model applies only to --backend emulated"),
])
def test_bad_requests_are_rejected_with_the_valid_set(kwargs, message):
    with pytest.raises(InvalidArgument) as info:
        resolve_configs(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("item", ["NOEQUALS", "=value", "1BAD=x", "SPACE NAME=x"])
def test_malformed_env_assignments_are_rejected(item):
    with pytest.raises(InvalidArgument, match="env must be NAME=VALUE"):
        parse_env_assignments([item])


def test_gpu_without_a_gpu_is_bad_input(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the standard way to hide every GPU
    assert not gpu_visible()
    with pytest.raises(InvalidArgument, match="no GPU is visible"):
        resolve_device("gpu")
    assert resolve_device("auto") == "cpu"


def test_child_environment_drops_inherited_switches_and_applies_the_config():
    parent = {"PATH": "/bin", "TF_CONV2D_USE_FP16_ACCUMULATE": "1", "XLA_FLAGS": "--x", "TF_ENABLE_ONEDNN_OPTS": "0"}
    default = TensorFlowConfig(accumulate="default", device="cpu")
    env = child_environment(default, base=parent)
    assert env["PATH"] == "/bin" and not (MANAGED_VARIABLES & set(env))
    fp16 = resolve_configs(backend="tensorflow", accumulate="fp16")[0]
    assert child_environment(fp16, base=parent)["TF_CONV2D_USE_FP16_ACCUMULATE"] == "1"


def test_config_round_trips_through_its_dict():
    for config in resolve_configs(backend="all", accumulate="all", jit_compile=True):
        assert BackendConfig.from_dict(config.to_dict()) == config


def test_each_configuration_carries_only_its_backends_fields():
    """Tagged per backend: no device 'emulated', no accumulate 'model', no jit on JAX."""
    emulated = emulated_config("a100").to_dict()
    assert emulated["model"] == "a100" and emulated["accumulate"] is None
    assert not {"device", "env", "jit_compile", "options"} & set(emulated)
    jax_row = matrix_rows("cpu", "jax")["f32-result"].to_dict()
    assert jax_row["options"] == {"preferred_element_type": "float32"} and "jit_compile" not in jax_row
    assert "options" not in matrix_rows("cpu")["jit+strict"].to_dict()
    # a document of an earlier layout is still read
    old = {"backend": "emulated", "accumulate": "model", "device": "emulated", "env": {}, "jit_compile": False,
           "model": "sequential:fp16", "options": {}, "note": "", "name": None, "warnings": []}
    read = BackendConfig.from_dict(old)
    assert (read.model, read.accumulate, read.device) == (emulated_config("sequential:fp16").model, None, "cpu")


def test_configurations_share_a_process_only_where_it_reads_the_same_switches():
    """JAX's rows that differ only in per-call options are separate processes' worth of
    answers (fingerprint runs one process per key); TensorFlow's jit is per function."""
    jax_rows = matrix_rows("cpu", "jax")
    assert jax_rows["strict"].process_key != jax_rows["strict+f32-result"].process_key
    assert jax_rows["default"].process_key != jax_rows["f32-result"].process_key
    rows = matrix_rows("cpu")
    jitted = [r for r in rows.values() if r.jit_compile]
    plain = {r.process_key for r in rows.values() if not r.jit_compile}
    assert any(dataclasses.replace(r, jit_compile=False).process_key in plain for r in jitted)
    assert all(r.process_key not in plain for r in jitted)


def test_a_model_spec_gets_one_canonical_label_and_is_validated_up_front():
    via_request = resolve_configs(backend="emulated", model="a100")
    assert [c.label for c in via_request] == [emulated_config("a100").label]
    assert via_request[0].label == "emulated/a100"  # the preset's own spelling
    assert emulated_config("A30:in=bf16").label == "emulated/a30:in=bf16"
    assert emulated_config("a100:subnormals=flush").label == "emulated/blocked:fp32:b=8:extra=1:subnormals=flush"
    with pytest.raises(InvalidArgument, match="b must be an integer >= 1; received 0"):
        resolve_configs(backend="emulated", model="blocked:fp16:b=0")


def test_a_gpu_only_switch_on_the_cpu_carries_a_no_effect_note():
    (config,) = resolve_configs(backend="tensorflow", accumulate="default", device="cpu",
                                extra_env={"TF_FP16_CONV_USE_FP32_COMPUTE": "0"})
    assert config.warnings == ("TF_FP16_CONV_USE_FP32_COMPUTE=0 has no effect on the CPU: only "
                               "TensorFlow's GPU (cuDNN/cuBLAS) kernels read it",)
    assert config.to_dict()["warnings"] == list(config.warnings)
    assert BackendConfig.from_dict(config.to_dict()) == config
    (plain,) = resolve_configs(backend="tensorflow", accumulate="default", device="cpu",
                               extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert plain.warnings == ()


def test_inherited_switches_are_named():
    from convprobe.backends.configurations import inherited_switches

    env = {"TF_FP16_CONV_USE_FP32_COMPUTE": "0", "HOME": "/root", "XLA_FLAGS": "--x"}
    assert inherited_switches(env) == {"TF_FP16_CONV_USE_FP32_COMPUTE": "0", "XLA_FLAGS": "--x"}


@pytest.mark.parametrize("features,runs", [
    (["avx512f", "avx512bw", "avx512bf16", "f16c"], False),  # AVX-512 without fp16 (AMD Zen 4): Eigen
    (["avx512bw", "avx512fp16"], True),
    (["avx512fp16"], False),  # AVX512-FP16 needs AVX512BW beside it
    (["avx512bw", "amx-fp16"], True),
    (["avxneconvert"], True),
    ([], False),
])
def test_onednn_runs_fp16_on_the_cpus_tensorflow_names(features, runs):
    assert onednn_runs_fp16(features) is runs



@pytest.mark.parametrize("kwargs,message", [
    ({"backend": "jax", "jit_compile": True}, "jit applies only to --backend tensorflow .*received --jit with --backend jax"),
    ({"backend": "torch", "model": "sequential:fp16"}, "model applies only to --backend emulated .*--backend torch"),
])
def test_an_option_the_chosen_framework_does_not_read_is_refused(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        resolve_configs(**kwargs)
