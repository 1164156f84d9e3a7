"""What an accumulation request means, concretely, for each backend and device.

One file, over 600 lines: the matrix, the requests that pick its rows and the device
checks are one table read together by every command (issue 60 splits it by concept).

`--accumulate fp16` is a wish; TensorFlow grants it only through environment
switches that differ per device and are read once per process. This module is
the one table that maps a request to those settings (README's table is
generated from the same data). Facts verified on TensorFlow 2.21 (DESIGN.md):

- CPU default: oneDNN f16 kernels accumulate in fp32, where the CPU lets oneDNN run
  fp16 (`onednn_runs_fp16`); elsewhere TensorFlow falls back to the Eigen kernels, the
  same as oneDNN off (measured on an AMD EPYC with AVX-512 but no AVX512-FP16).
- CPU fp16: the Eigen path (oneDNN off) with TF_CONV2D_USE_FP16_ACCUMULATE=1
  (only the exact string "1" enables it) accumulates conv2d in fp16.
- GPU: TF_FP16_CONV_USE_FP32_COMPUTE=0 (only the exact string "0") selects
  cuDNN's fp16 compute type; "1" keeps fp32 compute.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from typing import ClassVar

from convprobe.backends.jax import jax_installed
from convprobe.backends.pytorch import torch_installed
from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.emulation import AccumulationModel, parse_model
from convprobe.options import Accumulate, Backend, Device, names_or_all

__all__ = [
    "ACCUMULATE_CHOICES",
    "BACKEND_CHOICES",
    "DEVICE_CHOICES",
    "SETTINGS",
    "MANAGED_VARIABLES",
    "BackendConfig",
    "FrameworkConfig",
    "TensorFlowConfig",
    "JaxConfig",
    "TorchConfig",
    "TORCH_SETTINGS",
    "TORCH_MATRIX",
    "TORCH_MATRIX_DEFAULT",
    "EmulatedConfig",
    "emulated_config",
    "framework_installed",
    "resolve_configs",
    "resolve_device",
    "parse_env_assignments",
    "gpu_visible",
    "settings_table_markdown",
    "MATRIX",
    "MATRIX_DEFAULT",
    "MUST_SHOW",
    "JAX_SETTINGS",
    "JAX_MATRIX",
    "JAX_MATRIX_DEFAULT",
    "MATRIX_BACKENDS",
    "matrix_rows",
    "matrix_defaults",
    "matrix_configs",
    "onednn_runs_fp16",
]

ACCUMULATE_CHOICES = tuple(a.value for a in Accumulate)
BACKEND_CHOICES = tuple(b.value for b in Backend)
DEVICE_CHOICES = tuple(d.value for d in Device)


@dataclass(frozen=True)
class Setting:
    """The environment one (device, accumulate) request needs, and why."""

    env: dict[str, str]
    note: str


#: (device, accumulate) -> settings for TensorFlow. `default` sets nothing.
SETTINGS: dict[tuple[str, str], Setting] = {
    ("cpu", "fp16"): Setting(
        {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1"},
        "Eigen conv2d with fp16 accumulation (oneDNN off; only '1' enables it)",
    ),
    ("cpu", "fp32"): Setting(
        {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CONV2D_USE_FP16_ACCUMULATE": "0"},
        "oneDNN f16 kernels, which accumulate in fp32 (on a CPU oneDNN cannot run fp16 on, Eigen's: conv2d "
        "in fp32, its gradients in fp16)",
    ),
    ("cpu", "default"): Setting({}, "nothing set: TensorFlow's own choice"),
    ("gpu", "fp16"): Setting(
        {"TF_FP16_CONV_USE_FP32_COMPUTE": "0", "TF_FP16_MATMUL_USE_FP32_COMPUTE": "0"},
        "cuDNN/cuBLAS fp16 compute type (only '0' disables fp32; some shapes then fail)",
    ),
    ("gpu", "fp32"): Setting(
        {"TF_FP16_CONV_USE_FP32_COMPUTE": "1", "TF_FP16_MATMUL_USE_FP32_COMPUTE": "1"},
        "cuDNN/cuBLAS fp32 compute type for fp16 data",
    ),
    ("gpu", "default"): Setting({}, "nothing set: TensorFlow's own choice"),
}

#: Switches the table manages: removed from the inherited environment of a
#: child so that "default" really is TensorFlow's default.
MANAGED_VARIABLES = frozenset(
    name for setting in SETTINGS.values() for name in setting.env
) | {"XLA_FLAGS", "JAX_DEFAULT_MATMUL_PRECISION"}

#: cuDNN/cuBLAS compute-type switches: read by TensorFlow's GPU kernels only.
GPU_ONLY_SWITCHES = ("TF_FP16_CONV_USE_FP32_COMPUTE", "TF_FP16_MATMUL_USE_FP32_COMPUTE")


def gpu_switch_warnings(device: str, env: dict[str, str]) -> tuple[str, ...]:
    """One note per GPU-only switch set for a CPU configuration: it changes nothing there."""
    if device != "cpu":
        return ()
    return tuple(f"{name}={env[name]} has no effect on the CPU: only TensorFlow's GPU (cuDNN/cuBLAS) "
                 f"kernels read it" for name in GPU_ONLY_SWITCHES if name in env)


def inherited_switches(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The managed switches set in the user's shell, which every child has removed (each
    configuration sets its own; --env passes one on purpose)."""
    source = os.environ if environ is None else environ
    return {k: source[k] for k in sorted(MANAGED_VARIABLES) if k in source}


#: For the emulated backend, each request names an accumulation model.
EMULATED_MODELS = {"fp16": "sequential:fp16", "fp32": "sequential:fp32", "default": "sequential:fp32"}


class BackendConfig:
    """One configuration: everything needed to run it, in a fresh process where its backend
    reads switches. Tagged by backend (`TensorFlowConfig`, `JaxConfig`, `TorchConfig`,
    `EmulatedConfig`): each carries only what its backend has."""

    backend: ClassVar[str]
    #: The request it stands for ('fp16', 'fp32', 'default'); None where it was named
    #: directly (an emulator model, a matrix row that asks for nothing in particular).
    accumulate: str | None
    note: str
    #: Name of a configuration-matrix row ('onednn-off'); None for request-built configs.
    name: str | None
    #: Things the user should know about this configuration (a switch with no effect here).
    warnings: tuple[str, ...]

    @property
    def label(self) -> str:
        """Short, unique name for tables: 'tensorflow/cpu/fp16', 'emulated/sequential:fp16'."""
        raise NotImplementedError

    #: Where it computes: 'cpu' or 'gpu'.
    device: str

    @property
    def isolated(self) -> bool:
        """Whether it runs in a child process of its own: a framework reads its switches once
        per process; the emulator has no global state and runs in the caller's."""
        return True

    @property
    def environment(self) -> str:
        """The configuration's switches as 'NAME=VALUE ... option=value' ('' if none)."""
        return ""

    @property
    def process_key(self) -> str:
        """Configurations with one key may share a process: everything the process reads (not
        the request, the names or the notes)."""
        fields = {k: v for k, v in self.to_dict().items()
                  if k not in ("accumulate", "note", "label", "name", "warnings")}
        return json.dumps(fields, sort_keys=True)

    def _common(self) -> dict:
        return {"backend": self.backend, "accumulate": self.accumulate, "note": self.note, "label": self.label,
                "name": self.name, "warnings": list(self.warnings)}

    def to_dict(self) -> dict:
        raise NotImplementedError

    @staticmethod
    def from_dict(data: dict) -> BackendConfig:
        """The configuration a `to_dict` wrote, or one written before configurations were tagged
        (an emulated configuration with device 'emulated' and accumulate 'model'; a JAX one
        with jit_compile)."""
        kinds: dict[str, type[BackendConfig]] = {"tensorflow": TensorFlowConfig, "jax": JaxConfig,
                                                 "torch": TorchConfig, "emulated": EmulatedConfig}
        if data.get("backend") not in kinds:
            raise invalid_choice("config backend", str(data.get("backend")), tuple(kinds))
        accumulate = data.get("accumulate")
        common = {"accumulate": None if accumulate == "model" else accumulate, "note": data.get("note", ""),
                  "name": data.get("name"), "warnings": tuple(data.get("warnings", ()))}
        if data["backend"] == "emulated":
            return EmulatedConfig(model=parse_model(data["model"]), **common)
        framework = {"device": data["device"], "env": dict(data.get("env", {})), **common}
        if data["backend"] in ("jax", "torch"):
            kind = JaxConfig if data["backend"] == "jax" else TorchConfig
            return kind(options=dict(data.get("options", {})), **framework)
        return TensorFlowConfig(jit_compile=bool(data.get("jit_compile", False)), **framework)


@dataclass(frozen=True, kw_only=True)
class _Common:
    accumulate: str | None = None
    note: str = ""
    name: str | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FrameworkConfig(_Common, BackendConfig):
    """A framework on a device, with its environment switches (read once per process)."""

    device: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.name is not None:
            return f"{self.backend}/{self.device}/{self.name}"
        return "/".join([self.backend, self.device, str(self.accumulate), *self._label_tail()])

    def _label_tail(self) -> tuple[str, ...]:
        return ()

    @property
    def environment(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in sorted(self.env.items())),
                         *(f"{k}={v}" for k, v in sorted(self._options().items()))])

    def _options(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True, kw_only=True)
class TensorFlowConfig(FrameworkConfig):
    """TensorFlow: environment switches, and whether the op is compiled by XLA."""

    backend: ClassVar[str] = "tensorflow"
    jit_compile: bool = False

    def _label_tail(self) -> tuple[str, ...]:
        return ("jit",) if self.jit_compile else ()

    def to_dict(self) -> dict:
        return {**self._common(), "device": self.device, "env": dict(self.env), "jit_compile": self.jit_compile}


@dataclass(frozen=True, kw_only=True)
class _OptionsConfig(FrameworkConfig):
    """A framework whose switches are also set in code (`options`), not only in the environment."""

    options: dict[str, str] = field(default_factory=dict)

    def _options(self) -> dict[str, str]:
        return self.options

    def to_dict(self) -> dict:
        return {**self._common(), "device": self.device, "env": dict(self.env), "options": dict(self.options)}


@dataclass(frozen=True, kw_only=True)
class JaxConfig(_OptionsConfig):
    """JAX (every op compiled by XLA): environment switches and per-call options
    (precision, preferred_element_type)."""

    backend: ClassVar[str] = "jax"


@dataclass(frozen=True, kw_only=True)
class TorchConfig(_OptionsConfig):
    """PyTorch: its process-wide switches (`convprobe.backends.pytorch.SWITCHES`) as options."""

    backend: ClassVar[str] = "torch"


@dataclass(frozen=True, kw_only=True)
class EmulatedConfig(_Common, BackendConfig):
    """The exact emulator under one accumulation model; it computes on the host's CPU, in
    the caller's process."""

    backend: ClassVar[str] = "emulated"
    model: AccumulationModel

    @property
    def label(self) -> str:  # the default request shares fp32's model: say which row
        return f"emulated/{self.model.to_spec()}" + (" (default)" if self.accumulate == "default" else "")

    @property
    def device(self) -> str:  # type: ignore[override]  # (the others' field: the emulator runs on the host CPU)
        return "cpu"

    @property
    def isolated(self) -> bool:
        return False

    def to_dict(self) -> dict:
        return {**self._common(), "model": self.model.to_spec()}


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible, without importing any framework."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(re.fullmatch(r"nvidia\d+", name) for name in _dev_entries())


def _dev_entries() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def resolve_device(device: str) -> str:
    """'auto' -> gpu when one is visible, else cpu; 'gpu' without one is bad input."""
    if device not in DEVICE_CHOICES:
        raise invalid_choice("device", device, DEVICE_CHOICES)
    if device == "auto":
        return "gpu" if gpu_visible() else "cpu"
    if device == "gpu" and not gpu_visible():
        raise InvalidArgument("device gpu was requested but no GPU is visible on this machine; use --device cpu or "
                              "auto, or ask the GPU question from this CPU with the tensor cores' emulated presets "
                              "(--backend emulated --model v100:out=fp16, a100, h100)")
    return device


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_assignments(assignments: list[str] | None) -> dict[str, str]:
    """['NAME=VALUE', ...] -> dict; rejects malformed items, and a NAME given twice (one of the
    two would be dropped without a word), with a clear message."""
    env: dict[str, str] = {}
    for item in assignments or []:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise InvalidArgument(f"env must be NAME=VALUE with NAME a valid variable name; received {item!r}")
        if name in env:
            raise InvalidArgument(f"env sets {name} twice ({name}={env[name]} and {item}); give each variable once")
        env[name] = value
    return env


def _expand(value: str, choices: tuple[str, ...], argument: str) -> tuple[str, ...]:
    if value == "all":
        return choices
    if value not in choices:
        raise invalid_choice(argument, value, (*choices, "all"))
    return (value,)


def framework_installed(name: str) -> bool:
    """Whether a framework (tensorflow, jax, torch) can be imported here, without importing it."""
    checks = {"tensorflow": lambda: importlib.util.find_spec("tensorflow") is not None, "jax": jax_installed,
              "torch": torch_installed}
    if name not in checks:
        raise invalid_choice("framework", name, tuple(checks))
    return checks[name]()


def emulated_config(model: str | AccumulationModel, accumulate: str | None = None, note: str = "") -> EmulatedConfig:
    """The emulator under `model` (a spec is validated here, at the edge)."""
    value = parse_model(model) if isinstance(model, str) else model
    return EmulatedConfig(model=value, accumulate=accumulate, note=note or f"exact emulation: {value.describe()}")


def resolve_configs(
    *,
    backend: str = "tensorflow",
    accumulate: str = "default",
    device: str = "cpu",
    extra_env: dict[str, str] | None = None,
    jit_compile: bool = False,
    model: str | None = None,
) -> list[BackendConfig]:
    """Expand a request (each argument may be 'all' where it makes sense) into configs.

    Validates every argument before anything runs, so bad input costs nothing.
    """
    backends = tuple(name for name in _expand(backend, BACKEND_CHOICES, "backend")  # all: the installed frameworks
                     if backend != "all" or name == "emulated" or framework_installed(name))
    accumulates = _expand(accumulate, ACCUMULATE_CHOICES, "accumulate")
    resolved_device = resolve_device(device)
    if model is not None and "emulated" not in backends:
        raise InvalidArgument(f"model applies only to --backend emulated (or all); received --model with --backend "
                              f"{backend}")
    if jit_compile and "tensorflow" not in backends:
        raise InvalidArgument(f"jit applies only to --backend tensorflow (or all; JAX always compiles, PyTorch by its "
                              f"'compile' rows); received --jit with --backend {backend}")
    configs: list[BackendConfig] = []
    for name in backends:
        if name == "emulated" and model is not None:
            configs.append(emulated_config(model))
            continue
        for acc in accumulates:
            if name in ("jax", "torch"):
                kind = JaxConfig if name == "jax" else TorchConfig  # (a request no switch expresses: a warning)
                env, options, note = (JAX_SETTINGS if name == "jax" else TORCH_SETTINGS)[(resolved_device, acc)]
                configs.append(kind(accumulate=acc, device=resolved_device, env={**env, **(extra_env or {})},
                                    options=dict(options), note=note,
                                    warnings=(note,) if acc != "default" and not env and not options else ()))
            elif name == "tensorflow":
                setting = SETTINGS[(resolved_device, acc)]
                env = {**setting.env, **(extra_env or {})}
                configs.append(TensorFlowConfig(
                    accumulate=acc, device=resolved_device, env=env, jit_compile=jit_compile,
                    note=setting.note, warnings=gpu_switch_warnings(resolved_device, extra_env or {}),
                ))
            else:
                configs.append(emulated_config(EMULATED_MODELS[acc], acc, f"exact emulation: {EMULATED_MODELS[acc]}"))
    return configs


def settings_table_markdown() -> str:
    """The request -> settings table as Markdown (the README embeds this verbatim)."""
    lines = ["| device | `--accumulate` | environment of the child process | what it selects |", "|---|---|---|---|"]
    for (device, accumulate), setting in SETTINGS.items():
        env = " ".join(f"`{k}={v}`" for k, v in setting.env.items()) or "(nothing set)"
        lines.append(f"| {device} | {accumulate} | {env} | {setting.note} |")
    return "\n".join(lines)


# -- the TensorFlow configuration matrix (fingerprint, identify, sweep) ----------

_STRICT = "--xla_cpu_strict_dot_conv_math=true"
_NO_EXCESS = "--xla_allow_excess_precision=false"

#: device -> name -> (environment, jit_compile, accumulate requested, note).
#: On CPU the cuDNN/cuBLAS switches (TF_FP16_CONV_USE_FP32_COMPUTE,
#: TF_FP16_MATMUL_USE_FP32_COMPUTE) change nothing (DESIGN.md), so the CPU matrix
#: does not multiply its rows by them; 'gpu-switches' is one control row that
#: shows it, run only when named. TF_CONV2D_USE_FP16_ACCUMULATE only matters on
#: the Eigen path (oneDNN off); 'fp16-acc' is the control that shows oneDNN
#: ignores it.
MATRIX: dict[str, dict[str, tuple[dict[str, str], bool, str, str]]] = {
    "cpu": {
        "default": ({}, False, "default", "nothing set: oneDNN f16 kernels (Eigen's where the CPU lacks them)"),
        "onednn-off": ({"TF_ENABLE_ONEDNN_OPTS": "0"}, False, "default", "Eigen kernels"),
        "onednn-off+fp16-acc": (
            SETTINGS[("cpu", "fp16")].env, False, "fp16", "Eigen conv2d asked to accumulate in fp16",
        ),
        "fp16-acc": ({"TF_CONV2D_USE_FP16_ACCUMULATE": "1"}, False, "fp16", "control: the Eigen switch with oneDNN on"),
        "jit": ({}, True, "default", "XLA CPU, default flags"),
        "jit+strict": ({"XLA_FLAGS": _STRICT}, True, "fp16", "XLA CPU keeps f16 dots/convs in f16"),
        "jit+strict+no-excess": (
            {"XLA_FLAGS": f"{_STRICT} {_NO_EXCESS}"}, True, "fp16", "strict f16 math and no excess precision in fusions",
        ),
        "jit+no-excess": ({"XLA_FLAGS": _NO_EXCESS}, True, "default", "XLA CPU without excess precision in fusions"),
        "onednn-off+jit+strict": (
            {"TF_ENABLE_ONEDNN_OPTS": "0", "XLA_FLAGS": _STRICT}, True, "fp16", "strict XLA with oneDNN off",
        ),
        "gpu-switches": (
            SETTINGS[("gpu", "fp16")].env, False, "fp16",
            "control: the cuDNN/cuBLAS fp16-compute switches on a CPU (expected: no effect)",
        ),
    },
    "gpu": {
        "default": ({}, False, "default", "cuDNN/cuBLAS defaults"),
        "fp16-compute": (
            SETTINGS[("gpu", "fp16")].env, False, "fp16", "cuDNN/cuBLAS fp16 compute type",
        ),
        "fp32-compute": (
            SETTINGS[("gpu", "fp32")].env, False, "fp32", "cuDNN/cuBLAS fp32 compute type",
        ),
        "jit": ({}, True, "default", "XLA GPU"),
        "jit+fp16-compute": (
            SETTINGS[("gpu", "fp16")].env, True, "fp16", "XLA GPU with the fp16 compute switches",
        ),
    },
}

#: Rows run when no names are given (controls are run only when named).
MATRIX_DEFAULT: dict[str, tuple[str, ...]] = {
    "cpu": (
        "default", "onednn-off", "onednn-off+fp16-acc", "fp16-acc", "jit", "jit+strict",
        "jit+strict+no-excess", "jit+no-excess",
    ),
    "gpu": ("default", "fp16-compute", "fp32-compute", "jit", "jit+fp16-compute"),
}

#: The five CPU configurations the fingerprint must tell apart.
MUST_SHOW = ("default", "onednn-off", "onednn-off+fp16-acc", "jit", "jit+strict")


# -- JAX (an optional extra: `convprobe.backends.jax`) ------------------------------

_F32_RESULT = {"preferred_element_type": "float32"}
_F16_RESULT = {"preferred_element_type": "float16"}

#: (device, accumulate) -> (environment, call options, note) for JAX.
JAX_SETTINGS: dict[tuple[str, str], tuple[dict[str, str], dict[str, str], str]] = {
    ("cpu", "fp16"): ({"XLA_FLAGS": _STRICT}, {}, "XLA CPU keeps f16 convs in f16 (strict conv math)"),
    ("cpu", "fp32"): ({}, _F32_RESULT, "float32 result type asked of XLA (preferred_element_type), cast to f16"),
    ("cpu", "default"): ({}, {}, "nothing set: JAX's own choice"),
    ("gpu", "fp16"): ({}, _F16_RESULT, "f16 result type asked of XLA (preferred_element_type)"),
    ("gpu", "fp32"): ({}, _F32_RESULT, "float32 result type asked of XLA (preferred_element_type), cast to f16"),
    ("gpu", "default"): ({}, {}, "nothing set: JAX's own choice"),
}

#: device -> name -> (environment, call options, accumulate requested, note), as MATRIX for JAX.
JAX_MATRIX: dict[str, dict[str, tuple[dict[str, str], dict[str, str], str, str]]] = {
    "cpu": {
        "default": ({}, {}, "default", "nothing set: XLA CPU's own choice"),
        "f32-result": ({}, _F32_RESULT, "fp32", "preferred_element_type=float32, cast back to f16"),
        "f16-result": ({}, _F16_RESULT, "fp16", "preferred_element_type=float16"),
        "highest": ({}, {"precision": "highest"}, "default", "precision=HIGHEST (jax_default_matmul_precision)"),
        "strict": ({"XLA_FLAGS": _STRICT}, {}, "fp16", "XLA CPU keeps f16 dots/convs in f16"),
        "strict+f32-result": ({"XLA_FLAGS": _STRICT}, _F32_RESULT, "fp32",
                              "strict f16 conv math, asked for a float32 result"),
        "no-excess": ({"XLA_FLAGS": _NO_EXCESS}, {}, "default", "XLA CPU without excess precision in fusions"),
    },
    "gpu": {
        "default": ({}, {}, "default", "nothing set: XLA GPU's own choice"),
        "f32-result": ({}, _F32_RESULT, "fp32", "preferred_element_type=float32, cast back to f16"),
        "f16-result": ({}, _F16_RESULT, "fp16", "preferred_element_type=float16"),
        "highest": ({}, {"precision": "highest"}, "default", "precision=HIGHEST"),
    },
}
JAX_MATRIX_DEFAULT: dict[str, tuple[str, ...]] = {
    "cpu": ("default", "f32-result", "strict", "strict+f32-result"),
    "gpu": ("default", "f32-result", "f16-result"),
}

# -- PyTorch's switches (convprobe.backends.pytorch) ----------------------------------------

_NO_CPU_SWITCH = ("PyTorch has no switch that asks for {} accumulation of fp16 convs on the CPU: this row runs"
                  " PyTorch's default")

#: (device, accumulate) -> (environment, switches, note) for PyTorch.
TORCH_SETTINGS: dict[tuple[str, str], tuple[dict[str, str], dict[str, str], str]] = {
    ("cpu", "fp16"): ({}, {}, _NO_CPU_SWITCH.format("fp16")),
    ("cpu", "fp32"): ({}, {}, _NO_CPU_SWITCH.format("fp32")),
    ("cpu", "default"): ({}, {}, "nothing set: PyTorch's own choice"),
    ("gpu", "fp16"): ({}, {"fp16_reduced_precision_reduction": "on"},
                      "cuBLAS may reduce split-K partial sums in fp16 (allow_fp16_reduced_precision_reduction; "
                      "matmul only; PyTorch's default)"),
    ("gpu", "fp32"): ({}, {"fp16_reduced_precision_reduction": "off"},
                      "cuBLAS reductions kept in fp32 (allow_fp16_reduced_precision_reduction=False; matmul only)"),
    ("gpu", "default"): ({}, {}, "nothing set: PyTorch's own choice"),
}

#: device -> name -> (environment, switches, accumulate requested, note).
TORCH_MATRIX: dict[str, dict[str, tuple[dict[str, str], dict[str, str], str, str]]] = {
    "cpu": {
        "default": ({}, {}, "default", "nothing set: PyTorch's own choice"),
        "mkldnn-off": ({}, {"mkldnn": "off"}, "default", "torch.backends.mkldnn.enabled = False"),
        "compile": ({}, {"compile": "inductor"}, "default", "torch.compile (Inductor), its backward by AOTAutograd"),
        "compile+emulate-casts": ({}, {"compile": "inductor", "emulate_precision_casts": "on"}, "default",
                                  "torch.compile with Inductor's emulate_precision_casts"),
        "matmul-medium": ({}, {"float32_matmul_precision": "medium"}, "default",
                          "torch.set_float32_matmul_precision('medium') (fp32 matmuls only)"),
    },
    "gpu": {
        "default": ({}, {}, "default", "nothing set: PyTorch's own choice"),
        "reduction-fp32": ({}, {"fp16_reduced_precision_reduction": "off"}, "fp32",
                           "allow_fp16_reduced_precision_reduction = False"),
        "cudnn-off": ({}, {"cudnn": "off"}, "default", "torch.backends.cudnn.enabled = False"),
        "tf32": ({}, {"tf32": "on"}, "default", "cuDNN and cuBLAS TF32 on (fp32 ops only)"),
        "compile": ({}, {"compile": "inductor"}, "default", "torch.compile (Inductor)"),
    },
}
TORCH_MATRIX_DEFAULT: dict[str, tuple[str, ...]] = {
    "cpu": ("default", "mkldnn-off"),
    "gpu": ("default", "reduction-fp32", "cudnn-off"),
}

#: The frameworks with a configuration matrix (the study commands' --backend).
MATRIX_BACKENDS = tuple(b.value for b in Backend if b is not Backend.EMULATED)


def matrix_rows(device: str, backend: str = "tensorflow") -> dict[str, BackendConfig]:
    """Every row of a framework's matrix on `device` ('cpu' or 'gpu', not resolved: listing
    what would run needs no GPU), by name."""
    if backend not in MATRIX_BACKENDS:
        raise invalid_choice("backend", backend, MATRIX_BACKENDS)
    if backend == "tensorflow":
        return {name: TensorFlowConfig(accumulate=accumulate, device=device, env=dict(env), jit_compile=jit,
                                       note=note, name=name)
                for name, (env, jit, accumulate, note) in MATRIX[device].items()}
    kind, matrix = (JaxConfig, JAX_MATRIX) if backend == "jax" else (TorchConfig, TORCH_MATRIX)
    return {name: kind(accumulate=accumulate, device=device, env=dict(env), options=dict(options), note=note,
                       name=name)
            for name, (env, options, accumulate, note) in matrix[device].items()}


def matrix_defaults(device: str, backend: str = "tensorflow") -> tuple[str, ...]:
    """The rows a framework's matrix runs when none are named."""
    return {"tensorflow": MATRIX_DEFAULT, "jax": JAX_MATRIX_DEFAULT, "torch": TORCH_MATRIX_DEFAULT}[backend][device]


def matrix_configs(device: str = "cpu", names: list[str] | str | None = None,
                   backend: str = "tensorflow") -> list[BackendConfig]:
    """A framework's configurations of the matrix, by name ('all' or None = the default rows)."""
    if backend not in MATRIX_BACKENDS:
        raise invalid_choice("backend", backend, MATRIX_BACKENDS)
    resolved = resolve_device(device)
    rows = matrix_rows(resolved, backend)
    chosen = matrix_defaults(resolved, backend) if names is None else names_or_all(names, tuple(rows),
                                                                                    "configuration")
    return [rows[name] for name in chosen]


#: The CPU features (LLVM's names, read from CPUID) with which TensorFlow 2.21 hands fp16 ops
#: to oneDNN: AVX512BW with AVX512-FP16 or AMX-FP16, or AVX-NE-CONVERT alone
#: (`IsDataTypeSupportedByOneDNNOnThisCPU` for DT_HALF, tensorflow/core/util/util.cc). Elsewhere
#: the Eigen kernels run, oneDNN on or off. (Linux's /proc/cpuinfo does not list AVX-NE-CONVERT.)
_ONEDNN_FP16_FEATURES = (("avx512bw", "avx512fp16"), ("avx512bw", "amx-fp16"), ("avxneconvert",))


def onednn_runs_fp16(features: list[str] | None = None) -> bool:
    """Whether TensorFlow's oneDNN kernels take fp16 ops on a CPU with these features
    (default: this machine's, from CPUID through llvmlite), which decides what the
    `default` configuration computes."""
    if features is None:
        import llvmlite.binding as llvm  # noqa: PLC0415 - only when asked

        features = [name for name, present in llvm.get_host_cpu_features().items() if present]
    present = set(features)
    return any(present.issuperset(group) for group in _ONEDNN_FP16_FEATURES)
