"""The exact emulator behind the backend interface.

Its arithmetic is known bit for bit (an `AccumulationModel` from
`convprobe.emulation`), so it is both a backend to probe and the ground truth the
probes are checked against: every probe must infer, from the emulator, exactly
the model it was given.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from convprobe.backends.base import AbstractBackend, normalize_pair
from convprobe.errors import InvalidArgument, invalid_choice
from convprobe.formats import FP32, FP64, format_of_dtype

if TYPE_CHECKING:
    from convprobe.emulation import AccumulationModel

__all__ = ["EmulatedBackend"]


def _groups(input_shape: tuple, filter_shape: tuple) -> int:
    """A conv's groups as TensorFlow infers them: input channels over the filter's (an uneven
    ratio is left to the emulator's own message)."""
    if len(input_shape) != 4 or len(filter_shape) != 4 or not filter_shape[2]:
        return 1
    channels, per_group = int(input_shape[3]), int(filter_shape[2])
    return channels // per_group if channels % per_group == 0 else 1


class EmulatedBackend(AbstractBackend):
    """conv2d and its gradients computed by an exact accumulation model."""

    name = "emulated"
    capabilities = frozenset({
        "conv2d", "conv2d_backprop_input", "conv2d_backprop_filter",
        "depthwise_conv2d", "conv3d", "matmul", "einsum",
    })

    def __init__(self, model="sequential:fp16"):
        from convprobe.emulation import AccumulationModel, parse_model

        self.model = model if isinstance(model, AccumulationModel) else parse_model(model)

    def model_for(self, *arrays) -> "AccumulationModel":
        """The model this backend applies to inputs of these dtypes (see module docstring)."""
        from convprobe.emulation import Sequential
        widest = max((np.asarray(a).dtype for a in arrays), key=lambda d: d.itemsize)
        data_format = format_of_dtype(widest)
        wide = {4: FP32, 8: FP64}.get(widest.itemsize)
        if wide is not None and self.model.accumulator.precision < wide.precision:
            return Sequential(wide)
        if self.model.output != data_format:
            return dataclasses.replace(self.model, output=data_format)
        return self.model

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        from convprobe.emulation import conv2d

        return conv2d(
            x, w, self.model_for(x, w), strides=normalize_pair(strides, "strides"), padding=padding,
            dilation=normalize_pair(dilation, "dilation"), groups=_groups(np.shape(x), np.shape(w)),
        )

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        from convprobe.emulation import conv2d_backprop_input

        return conv2d_backprop_input(
            dy, w, tuple(input_shape), self.model_for(dy, w), strides=normalize_pair(strides, "strides"),
            padding=padding, dilation=normalize_pair(dilation, "dilation"),
            groups=_groups(tuple(input_shape), np.shape(w)),
        )

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        from convprobe.emulation import conv2d_backprop_filter

        return conv2d_backprop_filter(
            x, dy, tuple(filter_shape), self.model_for(x, dy), strides=normalize_pair(strides, "strides"),
            padding=padding, dilation=normalize_pair(dilation, "dilation"),
            groups=_groups(np.shape(x), tuple(filter_shape)),
        )

    def depthwise_conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        """Depthwise conv (filter kh, kw, C, multiplier) as a grouped conv2d, one group per channel."""
        from convprobe.emulation import conv2d

        w = np.asarray(w)
        kh, kw, c, mult = w.shape
        grouped = w.reshape(kh, kw, 1, c * mult)
        return conv2d(
            x, grouped, self.model_for(x, w), strides=normalize_pair(strides, "strides"), padding=padding,
            dilation=normalize_pair(dilation, "dilation"), groups=c,
        )

    def depthwise_conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        """The depthwise conv's input gradient, as the grouped conv2d's (one group per channel)."""
        from convprobe.emulation import conv2d_backprop_input

        w = np.asarray(w)
        kh, kw, c, mult = w.shape
        return conv2d_backprop_input(
            dy, w.reshape(kh, kw, 1, c * mult), tuple(input_shape), self.model_for(dy, w),
            strides=normalize_pair(strides, "strides"), padding=padding,
            dilation=normalize_pair(dilation, "dilation"), groups=c,
        )

    def depthwise_conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        """The depthwise conv's filter gradient (kh, kw, C, multiplier), as the grouped conv2d's."""
        from convprobe.emulation import conv2d_backprop_filter

        kh, kw, c, mult = (int(v) for v in filter_shape)
        grouped = conv2d_backprop_filter(
            x, dy, (kh, kw, 1, c * mult), self.model_for(x, dy), strides=normalize_pair(strides, "strides"),
            padding=padding, dilation=normalize_pair(dilation, "dilation"), groups=c,
        )
        return grouped.reshape(kh, kw, c, mult)

    def conv3d(self, x, w, *, strides=1, padding="VALID"):
        """VALID 3-D convolution (NDHWC x, DHWIO w), reducing over (kd, kh, kw, c) in that order."""
        from convprobe.emulation import dot

        if not (isinstance(padding, str) and padding.upper() == "VALID"):
            raise invalid_choice("padding", padding, ("VALID",))
        stride = (strides,) * 3 if isinstance(strides, int) else tuple(int(s) for s in strides)
        x, w = np.asarray(x), np.asarray(w)
        kd, kh, kw, c, o = w.shape
        windows = sliding_window_view(x, (kd, kh, kw), axis=(1, 2, 3))  # N, D', H', W', C, kd, kh, kw
        windows = windows[:, ::stride[0], ::stride[1], ::stride[2]]
        patches = windows.transpose(0, 1, 2, 3, 5, 6, 7, 4).reshape(*windows.shape[:4], 1, -1)
        filters = w.reshape(-1, o).T  # O, K
        return dot(patches, filters, self.model_for(x, w))

    def matmul(self, a, b):
        """(..., M, K) @ (K, N) with every output reduced over K in index order."""
        from convprobe.emulation import dot

        a, b = np.asarray(a), np.asarray(b)
        return dot(a[..., :, None, :], np.swapaxes(b, -1, -2)[..., None, :, :], self.model_for(a, b))

    def einsum(self, equation, a, b):
        """Two-operand einsum whose contracted indices appear in both operands; they are reduced
        together, flattened in their order in the first operand."""
        from convprobe.emulation import dot

        inputs, arrow, output = equation.replace(" ", "").partition("->")
        terms = inputs.split(",")
        if not arrow or len(terms) != 2 or "." in equation:
            raise InvalidArgument(f"einsum equation must be explicit 'ab,bc->ac' with two operands; received {equation!r}")
        left, right = terms
        a, b = np.asarray(a), np.asarray(b)
        contracted = [i for i in left if i in right and i not in output]
        if not contracted or any(i not in left + right for i in output):
            raise InvalidArgument(f"einsum equation must contract at least one index; received {equation!r}")
        sizes = {**dict(zip(left, a.shape)), **dict(zip(right, b.shape))}

        def arrange(arr, labels):
            order = [labels.index(i) for i in output if i in labels] + [labels.index(i) for i in contracted]
            moved = np.transpose(arr, order)
            shape = [sizes[i] if i in labels else 1 for i in output] + [-1]
            return moved.reshape(shape)

        return dot(arrange(a, left), arrange(b, right), self.model_for(a, b))

    def describe(self) -> dict:
        return {"backend": self.name, "model": self.model.name, "model_description": self.model.describe()}
