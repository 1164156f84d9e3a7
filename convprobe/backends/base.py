"""The one interface every convolution engine implements.

A backend takes NumPy arrays (NHWC inputs, HWIO filters) in the dtype the caller
chose and returns a NumPy array; whatever arithmetic it does in between is what
convprobe investigates. Only `conv2d` is required; gradient convolutions and
other ops are declared in `capabilities`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from convprobe.emulation.conv import pair

__all__ = ["AbstractBackend", "Padding", "normalize_pair"]

Padding = str | Sequence[tuple[int, int]]


def normalize_pair(value: int | Sequence[int], argument: str) -> tuple[int, int]:
    """Strides/dilations as an (h, w) pair of positive ints: the emulator's rule
    (`emulation.conv.pair`), so a backend and the emulator accept the same values."""
    return pair(value, argument)


class AbstractBackend(abc.ABC):
    """A convolution engine whose arithmetic is under investigation."""

    #: Short identifier used in result rows ("tensorflow", "emulated").
    name: str = "abstract"

    #: The ops this backend implements, e.g. {"conv2d", "conv2d_backprop_input"}.
    capabilities: frozenset[str] = frozenset({"conv2d"})

    @abc.abstractmethod
    def conv2d(
        self,
        x: np.ndarray,
        w: np.ndarray,
        *,
        strides: int | Sequence[int] = 1,
        padding: Padding = "VALID",
        dilation: int | Sequence[int] = 1,
    ) -> np.ndarray:
        """2-D convolution (cross-correlation) of NHWC `x` with HWIO `w`."""

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        """Gradient of conv2d with respect to its input."""
        raise NotImplementedError(f"{self.name} does not implement conv2d_backprop_input")

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        """Gradient of conv2d with respect to its filter."""
        raise NotImplementedError(f"{self.name} does not implement conv2d_backprop_filter")

    def describe(self) -> dict:
        """JSON-serialisable description of this backend's configuration."""
        return {"backend": self.name}
