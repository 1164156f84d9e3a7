"""Real TensorFlow convolutions, imported lazily.

The precision switches TensorFlow reads (TF_ENABLE_ONEDNN_OPTS,
TF_CONV2D_USE_FP16_ACCUMULATE, TF_FP16_CONV_USE_FP32_COMPUTE, XLA_FLAGS) are read
once per process and cached, so this backend never sets them: the isolation
layer starts a fresh process with them already in its environment.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re

import numpy as np

from convprobe.backends.base import AbstractBackend, normalize_pair
from convprobe.errors import UnsupportedConfiguration, invalid_choice

__all__ = ["TensorFlowBackend", "DEVICES"]

DEVICES = ("cpu", "gpu")


def _padding_arg(padding):
    """TF takes "VALID"/"SAME" or explicit NHWC paddings [[0,0],[t,b],[l,r],[0,0]]."""
    if isinstance(padding, str):
        if padding.upper() not in ("VALID", "SAME"):
            raise invalid_choice("padding", padding, ("VALID", "SAME", "[(top, bottom), (left, right)]"))
        return padding.upper()
    (top, bottom), (left, right) = padding
    return [[0, 0], [int(top), int(bottom)], [int(left), int(right)], [0, 0]]


#: What TensorFlow says when a kernel lacks a case (CPU convolutions with dilation > 1).
_NOT_IMPLEMENTED = re.compile(r"do(?:es)? not (?:yet )?support|not (?:yet )?(?:implemented|supported)", re.IGNORECASE)


def _unsupported_text(exc: Exception) -> str:
    """The first line of TensorFlow's message, without its function-node prefix."""
    lines = re.sub(r"\{\{[^}]*\}\}\s*", "", getattr(exc, "message", str(exc))).strip().splitlines()
    return lines[0] if lines else ""


def _unsupported(exc: Exception) -> Exception:
    """A TensorFlow refusal (a kernel lacks this case) as an UnsupportedConfiguration that says
    TensorFlow's own words; any other error unchanged."""
    message = _unsupported_text(exc)
    if not _NOT_IMPLEMENTED.search(message):
        return exc
    return UnsupportedConfiguration(f"TensorFlow: {message}")


def _array(value):
    """NumPy arrays as given; TensorFlow tensors (inside `run_together`) untouched."""
    return value if hasattr(value, "dtype") and type(value).__module__.startswith("tensorflow") else np.asarray(value)


def _gradient_conv_args(strides, padding, dilation):
    """(strides, dilation, padding name, flat explicit paddings) for the raw gradient ops."""
    pad = _padding_arg(padding)
    explicit = pad if isinstance(pad, list) else []
    return (
        normalize_pair(strides, "strides"), normalize_pair(dilation, "dilation"),
        "EXPLICIT" if explicit else pad, sum(explicit, []),
    )


#: The most calls one function `run_together` compiles holds. Longer lists run in groups of this
#: many, and a group is padded to a power of two: the crafted-input probes' thousands of calls
#: then trace and compile a few dozen functions, and a short list compiles a small one.
TOGETHER = 16


class TensorFlowBackend(AbstractBackend):
    """`tf.nn.conv2d` and its two gradient kernels on one device, optionally under XLA."""

    name = "tensorflow"
    capabilities = frozenset({
        "conv2d", "conv2d_backprop_input", "conv2d_backprop_filter",
        "depthwise_conv2d", "conv3d", "matmul", "einsum",
    })

    def __init__(self, device: str = "cpu", *, jit_compile: bool = False):
        if device not in DEVICES:
            raise invalid_choice("device", device, DEVICES)
        self.device = device
        self.jit_compile = bool(jit_compile)
        self._together: dict[tuple, object] = {}  # run_together's traced functions, by plan

    @functools.cached_property
    def tf(self):
        import tensorflow as tf

        if self.device == "gpu" and not tf.config.list_physical_devices("GPU"):
            raise UnsupportedConfiguration("TensorFlow sees no GPU in this process")
        return tf

    @contextlib.contextmanager
    def _on_device(self):
        """Ops placed on this backend's device; a kernel's refusal raised as `_unsupported`."""
        tf = self.tf
        with tf.device("/GPU:0" if self.device == "gpu" else "/CPU:0"):
            try:
                yield
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
                raise _unsupported(exc) from exc

    #: True while `run_together` traces its one function: ops return symbolic tensors.
    _symbolic = False

    def _run(self, fn, *args):
        if self._symbolic:
            return fn(*args)
        tf = self.tf
        if self.jit_compile:
            fn = tf.function(fn, jit_compile=True)
        with self._on_device():
            result = fn(*(tf.constant(a) if isinstance(a, np.ndarray) else a for a in args))
        return np.asarray(result.numpy())

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        strides, dilation, pad = normalize_pair(strides, "strides"), normalize_pair(dilation, "dilation"), _padding_arg(padding)

        def fn(x, w):
            return self.tf.nn.conv2d(x, w, strides=[1, *strides, 1], padding=pad, dilations=[1, *dilation, 1])

        return self._run(fn, _array(x), _array(w))

    def _gradient(self, raw_op: str, sizes: tuple[str, list], operands: dict, strides, padding, dilation):
        """One of TensorFlow's conv gradient kernels by its raw op name: `sizes` names the shape
        argument and its value, `operands` the two tensors by their argument names."""
        strides, dilation, pad_name, explicit = _gradient_conv_args(strides, padding, dilation)
        kernel = getattr(self.tf.raw_ops, raw_op)
        arguments = {sizes[0]: list(sizes[1]), "strides": [1, *strides, 1], "padding": pad_name,
                     "explicit_paddings": explicit, "dilations": [1, *dilation, 1]}
        first_name, second_name = operands

        @self.tf.autograph.experimental.do_not_convert  # plain graph code: autograph would rewrite the call
        def fn(first, second):
            return kernel(**arguments, **{first_name: first, second_name: second})

        return self._run(fn, *(_array(a) for a in operands.values()))

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        return self._gradient("Conv2DBackpropInput", ("input_sizes", input_shape), {"out_backprop": dy, "filter": w},
                              strides, padding, dilation)

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        try:
            return self._gradient("Conv2DBackpropFilter", ("filter_sizes", filter_shape),
                                  {"input": x, "out_backprop": dy}, strides, padding, dilation)
        except self.tf.errors.InvalidArgumentError as exc:
            if np.shape(x)[-1] == filter_shape[2]:
                raise
            # the CPU kernel reads filter_sizes as a dense filter's: its way of having no grouped case
            raise UnsupportedConfiguration(f"TensorFlow: {_unsupported_text(exc)} (its CPU filter gradient has no "
                                           f"grouped case: input channels {np.shape(x)[-1]}, filter's "
                                           f"{filter_shape[2]})") from exc

    def depthwise_conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        """`tf.nn.depthwise_conv2d`: NHWC x, filter (kh, kw, C, multiplier)."""
        strides, dilation, pad = normalize_pair(strides, "strides"), normalize_pair(dilation, "dilation"), _padding_arg(padding)

        def fn(x, w):
            return self.tf.nn.depthwise_conv2d(x, w, strides=[1, *strides, 1], padding=pad, dilations=list(dilation))

        return self._run(fn, _array(x), _array(w))

    def depthwise_conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        """TensorFlow's DepthwiseConv2dNativeBackpropInput: what training a DepthwiseConv2D runs."""
        return self._gradient("DepthwiseConv2dNativeBackpropInput", ("input_sizes", input_shape),
                              {"out_backprop": dy, "filter": w}, strides, padding, dilation)

    def depthwise_conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        """TensorFlow's DepthwiseConv2dNativeBackpropFilter: what training a DepthwiseConv2D runs."""
        return self._gradient("DepthwiseConv2dNativeBackpropFilter", ("filter_sizes", filter_shape),
                              {"input": x, "out_backprop": dy}, strides, padding, dilation)

    def conv3d(self, x, w, *, strides=1, padding="VALID"):
        """`tf.nn.conv3d`: NDHWC x, DHWIO filter."""
        stride = (strides,) * 3 if isinstance(strides, int) else tuple(strides)
        pad = _padding_arg(padding)
        if not isinstance(pad, str):
            raise invalid_choice("padding", padding, ("VALID", "SAME"))

        def fn(x, w):
            return self.tf.nn.conv3d(x, w, strides=[1, *stride, 1], padding=pad)

        return self._run(fn, _array(x), _array(w))

    def matmul(self, a, b):
        """`tf.linalg.matmul` of (..., M, K) by (..., K, N)."""

        def fn(a, b):
            return self.tf.linalg.matmul(a, b)

        return self._run(fn, _array(a), _array(b))

    def mat_mul(self, a, b, *, transpose_a=False, transpose_b=False, grad_a=False, grad_b=False):
        """TensorFlow's MatMul op of two matrices with its flags, as a Dense layer's forward pass
        (none) and its registered gradients (transpose_b and grad_a; transpose_a and grad_b) call it."""

        def fn(a, b):
            return self.tf.raw_ops.MatMul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b,
                                          grad_a=grad_a, grad_b=grad_b)

        return self._run(fn, _array(a), _array(b))

    def einsum(self, equation, a, b):
        """`tf.einsum(equation, a, b)` with two operands."""

        def fn(a, b):
            return self.tf.einsum(equation, a, b)

        return self._run(fn, _array(a), _array(b))

    def run_together(self, calls):
        """Run several op calls [(method name, args, kwargs)] as one function; NumPy results in order.

        Under jit_compile the calls run in groups of at most `TOGETHER` (a power of two), each one XLA function,
        traced and compiled once per distinct plan and reused (the compile, not the arithmetic,
        dominates a crafted-input battery); each op keeps its own kernel, so the results are
        those of the separate calls.
        Without jit the calls simply run one after another, eagerly, as always.
        """
        if not self.jit_compile:
            return [np.asarray(getattr(self, name)(*args, **kwargs)) for name, args, kwargs in calls]
        calls = list(calls)
        if not calls:
            return []
        size = min(TOGETHER, 1 << (len(calls) - 1).bit_length())
        if len(calls) != size:  # groups of a power of two (the last padded with its own last call): few traces
            groups = [calls[i:i + TOGETHER] for i in range(0, len(calls), TOGETHER)]
            padded = [group + group[-1:] * ((1 << (len(group) - 1).bit_length()) - len(group)) for group in groups]
            return [result for group, run in zip(groups, padded) for result in self.run_together(run)[:len(group)]]
        tf = self.tf
        arrays: list[np.ndarray] = []
        plan = []
        for name, args, kwargs in calls:
            slots = []
            for arg in args:
                if isinstance(arg, np.ndarray):
                    slots.append(("tensor", len(arrays)))
                    arrays.append(arg)
                else:
                    slots.append(("value", arg))
            plan.append((name, slots, kwargs))

        def body(*tensors):
            self._symbolic = True
            try:
                return [
                    getattr(self, name)(*(tensors[v] if kind == "tensor" else v for kind, v in slots), **kwargs)
                    for name, slots, kwargs in plan
                ]
            finally:
                self._symbolic = False

        # one traced function per plan: a plan seen before (the crafted-input probes repeat theirs
        # with new values) reuses its trace and its XLA executable; autograph has nothing to convert
        key = (repr(plan), tuple((a.shape, a.dtype.str) for a in arrays))
        function = self._together.get(key)
        if function is None:
            function = self._together[key] = tf.function(body, jit_compile=True, autograph=False)
        with self._on_device():
            outputs = function(*(tf.constant(a) for a in arrays))
        return [np.asarray(o.numpy()) for o in outputs]

    def runtime_info(self) -> dict:
        """What this TensorFlow process reports about itself (for provenance)."""
        tf = self.tf
        info = {
            "tensorflow_version": tf.__version__,
            "physical_devices": [d.name for d in tf.config.list_physical_devices()],
            "built_with_cuda": bool(tf.test.is_built_with_cuda()),
            # TensorFlow's default intra-op pool is one thread per available CPU
            "intra_op_threads": os.environ.get("TF_NUM_INTRAOP_THREADS", "default"),
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        }
        try:
            from tensorflow.python.util import _pywrap_util_port

            info["onednn_enabled"] = bool(_pywrap_util_port.IsMklEnabled())
        except (ImportError, AttributeError):
            info["onednn_enabled"] = None
        return info

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device, "jit_compile": self.jit_compile}
