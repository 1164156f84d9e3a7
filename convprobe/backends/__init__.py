"""Backends: one interface (`AbstractBackend`), many engines.

`TensorFlowBackend` imports TensorFlow lazily; `EmulatedBackend` wraps the exact
emulator; `isolation` runs a configuration in a fresh process.
"""

from convprobe.backends.base import AbstractBackend
from convprobe.backends.configurations import BackendConfig, resolve_configs
from convprobe.backends.emulated import EmulatedBackend
from convprobe.backends.tensorflow import TensorFlowBackend

__all__ = ["AbstractBackend", "BackendConfig", "EmulatedBackend", "TensorFlowBackend", "resolve_configs"]
