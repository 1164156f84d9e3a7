"""Backends as a test sees them: a `ConvBackend` handle and the ways to name one.

A test names a backend configuration the way the CLI prints it
("tensorflow/cpu/fp16", "emulated/sequential:fp16"), by an emulator model spec
("blocked:fp16:b=4", "a100"), or passes a `BackendConfig`, an
`AccumulationModel` or a backend object. `resolve_target` turns all of these
into one `BackendConfig`, validated before anything runs.

`ConvBackend.conv2d` runs an emulated configuration in this process and a
framework's (TensorFlow, JAX, PyTorch) in a fresh child process with the
configuration's switches (each reads them once per process, so that is the only
way the setting is honoured), through the same isolation layer the probes use.
Nothing here imports a framework.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

import numpy as np

from convprobe.backends.configurations import (
    ACCUMULATE_CHOICES,
    MANAGED_VARIABLES,
    MATRIX,
    BackendConfig,
    EmulatedConfig,
    TensorFlowConfig,
    MATRIX_BACKENDS,
    emulated_config,
    framework_installed,
    matrix_configs,
    matrix_rows,
    resolve_configs,
)
from convprobe.errors import InvalidArgument, invalid_choice

__all__ = ["ConvBackend", "resolve_target", "available_configs", "BACKEND_SELECTIONS"]

#: What `--convprobe-backends` may select for the `conv_backend` fixture.
BACKEND_SELECTIONS = ("emulated", "tensorflow", "jax", "torch", "all")

#: Child process task module (a probe-shaped module: `run` and `interpret`).
_TASK_MODULE = "convprobe.testing._conv_task"

_TARGET_FORMS = (
    "a BackendConfig, a ConvBackend, an AccumulationModel, an EmulatedBackend or "
    "TensorFlowBackend, or a string: 'tensorflow', 'tensorflow/cpu/fp16', "
    "'tensorflow/cpu/default/jit', a matrix row 'tensorflow/cpu/jit+strict', 'jax/cpu/fp32', "
    "'torch/cpu/mkldnn-off', 'emulated/sequential:fp16' or a model spec like 'sequential:fp16'"
)


def _framework_from_label(text: str) -> BackendConfig:
    """'FRAMEWORK[/DEVICE[/ACCUMULATE or MATRIX ROW]]' (TensorFlow also '.../ACCUMULATE/jit') -> the
    configuration the CLI would run, as its tables label it."""
    framework, *parts = text.split("/")
    device = parts[0] if parts else "cpu"
    accumulate = parts[1] if len(parts) > 1 else "default"
    jit = False
    if len(parts) > 2:
        if framework != "tensorflow" or parts[2] != "jit" or len(parts) > 3:
            raise InvalidArgument(f"backend must be {_TARGET_FORMS}; received {text!r}")
        jit = True
    if accumulate not in ACCUMULATE_CHOICES:
        # A row of the configuration matrix, as `convprobe fingerprint` labels it: 'tensorflow/cpu/jit+strict'.
        rows = matrix_rows(device if device in MATRIX else "cpu", framework)
        if accumulate in rows and not jit:
            (config,) = matrix_configs(device, [accumulate], framework)
            return config
        raise InvalidArgument(
            f"accumulate in {text!r} must be one of {', '.join(ACCUMULATE_CHOICES)} or a configuration "
            f"matrix row ({', '.join(rows)}); received {accumulate!r}"
        )
    (config,) = resolve_configs(backend=framework, accumulate=accumulate, device=device, jit_compile=jit)
    return config


def resolve_target(target: object) -> BackendConfig:
    """The `BackendConfig` that `target` names (see the module docstring for the forms)."""
    if isinstance(target, BackendConfig):
        return target
    if isinstance(target, ConvBackend):
        return target.config
    from convprobe.backends.emulated import EmulatedBackend
    from convprobe.backends.tensorflow import TensorFlowBackend

    if isinstance(target, EmulatedBackend):
        return emulated_config(target.model)
    if isinstance(target, TensorFlowBackend):
        # The object lives in this process: its arithmetic is whatever this
        # process's precision switches say, so the child inherits exactly those.
        env = {k: v for k, v in os.environ.items() if k in MANAGED_VARIABLES}
        return TensorFlowConfig(accumulate="default", device=target.device, env=env, jit_compile=target.jit_compile,
                                note="this process's TensorFlow settings")
    if isinstance(target, str):
        text = target.strip()
        if text.split("/")[0] in MATRIX_BACKENDS:
            return _framework_from_label(text)
        if text.startswith("emulated/"):
            return emulated_config(text.removeprefix("emulated/"))
        if text == "emulated":
            return emulated_config("sequential:fp32")
        try:
            return emulated_config(text)
        except InvalidArgument as exc:
            raise InvalidArgument(f"backend must be {_TARGET_FORMS}; received {target!r} ({exc})") from None
    from convprobe.emulation import AccumulationModel

    if isinstance(target, AccumulationModel):
        return emulated_config(target)
    raise InvalidArgument(f"backend must be {_TARGET_FORMS}; received {type(target).__name__} {target!r}")


def available_configs(selection: str = "emulated", *, device: str = "auto") -> list[BackendConfig]:
    """The configurations the `conv_backend` fixture runs over.

    emulated: sequential fp16 and fp32 accumulation (cheap, in process);
    tensorflow, jax, torch: that framework's default, fp16 and fp32 requests on `device`
    (auto = the GPU when one is visible, else the CPU), one child process each; all: the
    emulator and every installed framework. A framework named but not installed is refused.
    """
    if selection not in BACKEND_SELECTIONS:
        raise invalid_choice("convprobe-backends", selection, BACKEND_SELECTIONS)
    configs: list[BackendConfig] = []
    if selection in ("emulated", "all"):
        configs += resolve_configs(backend="emulated", accumulate="fp16")
        configs += resolve_configs(backend="emulated", accumulate="fp32")
    for framework in ("tensorflow", "jax", "torch"):
        present = framework_installed(framework)
        if selection == framework and not present:
            raise InvalidArgument(f"convprobe-backends {framework} needs the {framework} extra: "
                                  f"pip install 'convprobe[{framework}]'")
        if selection == framework or (selection == "all" and present):
            configs += resolve_configs(backend=framework, accumulate="all", device=device)
    return configs


def encode_array(a: np.ndarray) -> dict:
    """An array as JSON: dtype name, shape and the raw bytes in base64 (bit exact)."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_array(d: dict) -> np.ndarray:
    """Inverse of `encode_array`."""
    try:
        dtype = np.dtype(d["dtype"])
    except TypeError:
        import ml_dtypes

        dtype = np.dtype(getattr(ml_dtypes, d["dtype"]))
    return np.frombuffer(base64.b64decode(d["data"]), dtype=dtype).reshape(d["shape"]).copy()


@dataclass(frozen=True)
class ConvBackend:
    """One backend configuration under test: its `config`, and `conv2d` run under it."""

    config: BackendConfig
    timeout: float = 300.0

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def accumulate(self) -> str | None:
        """The accumulation the configuration asks for: fp16, fp32, or None (a framework's default / a model).
        A request no switch expresses (PyTorch's on the CPU) is still what was asked: see its warnings."""
        return self.config.accumulate if self.config.accumulate in ("fp16", "fp32") else None

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1) -> np.ndarray:
        """NHWC `x` (*) HWIO `w` on this configuration; the output in the backend's dtype."""
        x, w = np.asarray(x), np.asarray(w)
        if isinstance(self.config, EmulatedConfig):
            from convprobe.backends.emulated import EmulatedBackend

            return EmulatedBackend(self.config.model).conv2d(x, w, strides=strides, padding=padding, dilation=dilation)
        from convprobe.probes.runner import run_one

        params = {
            "x": encode_array(x), "w": encode_array(w), "strides": strides, "dilation": dilation,
            "padding": padding if isinstance(padding, str) else [list(p) for p in padding],
        }
        result = run_one(_TASK_MODULE, self.config, params, timeout=self.timeout)
        if result.status != "ok":
            raise RuntimeError(f"conv2d on {self.label} ended '{result.status}': {result.error}")
        return decode_array(result.observed["output"])

    def __repr__(self) -> str:
        env = self.config.environment
        return f"ConvBackend({self.label}{', ' + env if env else ''})"

