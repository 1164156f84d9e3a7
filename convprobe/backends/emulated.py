"""The exact emulator behind the backend interface.

Its arithmetic is known bit for bit (an `AccumulationModel` from
`convprobe.emulation`), so it is both a backend to probe and the ground truth the
probes are checked against: every probe must infer, from the emulator, exactly
the model it was given.
"""

from __future__ import annotations

from convprobe.backends.base import AbstractBackend, normalize_pair

__all__ = ["EmulatedBackend"]


class EmulatedBackend(AbstractBackend):
    """conv2d and its gradients computed by an exact accumulation model."""

    name = "emulated"
    capabilities = frozenset({"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"})

    def __init__(self, model="sequential:fp16"):
        from convprobe.emulation import AccumulationModel, parse_model

        self.model = model if isinstance(model, AccumulationModel) else parse_model(model)

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        from convprobe.emulation import conv2d

        return conv2d(
            x, w, self.model, strides=normalize_pair(strides, "strides"), padding=padding,
            dilation=normalize_pair(dilation, "dilation"),
        )

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        from convprobe.emulation import conv2d_backprop_input

        return conv2d_backprop_input(
            dy, w, tuple(input_shape), self.model, strides=normalize_pair(strides, "strides"),
            padding=padding, dilation=normalize_pair(dilation, "dilation"),
        )

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        from convprobe.emulation import conv2d_backprop_filter

        return conv2d_backprop_filter(
            x, dy, tuple(filter_shape), self.model, strides=normalize_pair(strides, "strides"),
            padding=padding, dilation=normalize_pair(dilation, "dilation"),
        )

    def describe(self) -> dict:
        return {"backend": self.name, "model": self.model.name, "model_description": self.model.describe()}
