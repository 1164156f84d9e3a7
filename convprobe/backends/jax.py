"""JAX's convolutions, as a JAX user's training step runs them, under JAX's precision switches.

The forward op is `jax.lax.conv_general_dilated` (NHWC input, HWIO filter), which
`flax`, `haiku` and `jax.numpy` call; its two gradients are what `jax.vjp` of that call
computes (the transposed convolutions JAX's autodiff emits), so they are the ops a
training step really runs. Each op is compiled by XLA (JAX has no other path): the
switches are JAX's own, applied per call:

- `precision`: `jax.lax.Precision` (default, high, highest), what
  `jax_default_matmul_precision` sets for a whole program;
- `preferred_element_type`: the result type XLA is asked to accumulate into (float16,
  float32); the result is cast back to the operands' dtype, as a mixed-precision layer does;
- the environment (`XLA_FLAGS`, e.g. ``--xla_cpu_strict_dot_conv_math=true``), read when
  JAX first starts XLA in this process: each configuration runs in its own.

JAX is an optional extra (``pip install -e ".[jax]"``): without it this backend says so
in one line as an unsupported configuration.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np

from convprobe.backends.base import AbstractBackend, normalize_pair
from convprobe.errors import UnsupportedConfiguration, invalid_choice

__all__ = ["JaxBackend", "PRECISIONS", "ACCUMULATION_TYPES", "jax_installed"]

#: `jax.lax.Precision` names a configuration may set.
PRECISIONS = ("default", "high", "highest")
#: The `preferred_element_type` values a configuration may set.
ACCUMULATION_TYPES = ("float16", "float32")


def jax_installed() -> bool:
    """Whether JAX can be imported here, without importing it."""
    return importlib.util.find_spec("jax") is not None


def _padding(padding):
    """'SAME', 'VALID' or explicit ((top, bottom), (left, right)), as lax takes them."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise invalid_choice("padding", padding, ("VALID", "SAME", "[(top, bottom), (left, right)]"))
        return padding.upper()
    return tuple((int(low), int(high)) for low, high in padding)


class JaxBackend(AbstractBackend):
    """`jax.lax.conv_general_dilated`, its two `jax.vjp` gradients and `jnp.matmul` on one device."""

    name = "jax"
    capabilities = frozenset({"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter", "matmul"})

    def __init__(self, device: str = "cpu", *, precision: str | None = None,
                 preferred_element_type: str | None = None):
        if precision is not None and precision not in PRECISIONS:
            raise invalid_choice("precision", precision, PRECISIONS)
        if preferred_element_type is not None and preferred_element_type not in ACCUMULATION_TYPES:
            raise invalid_choice("preferred_element_type", preferred_element_type, ACCUMULATION_TYPES)
        self.device = device
        self.precision = precision
        self.preferred_element_type = preferred_element_type

    @functools.cached_property
    def jax(self):
        if not jax_installed():
            raise UnsupportedConfiguration('JAX is not installed: pip install -e ".[jax]"')
        import jax

        return jax

    @functools.cached_property
    def _device(self):
        """The device every call runs on (one lookup per backend: identify makes thousands of calls)."""
        platform = "gpu" if self.device == "gpu" else "cpu"
        try:
            return self.jax.devices(platform)[0]
        except RuntimeError as exc:
            raise UnsupportedConfiguration(f"JAX sees no {platform.upper()} in this process ({exc})") from exc

    @functools.cached_property
    def _settings(self) -> dict:
        """The configuration's per-call arguments of lax.conv_general_dilated and jnp.matmul."""
        lax = self.jax.lax
        return {"precision": None if self.precision is None else lax.Precision[self.precision.upper()],
                "preferred_element_type": (None if self.preferred_element_type is None
                                           else np.dtype(self.preferred_element_type))}

    def _conv(self, strides, padding, dilation):
        """f(x, w): the forward convolution under this configuration, cast back to x's dtype."""
        lax, settings = self.jax.lax, self._settings

        def conv(x, w):
            y = lax.conv_general_dilated(x, w, window_strides=strides, padding=padding, rhs_dilation=dilation,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"), **settings)
            return y.astype(x.dtype)

        return conv

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one backend per process: its compiled ops live as long
    def _compiled(self, op: str, strides, padding, dilation, shape):
        """The jitted op (compiled once per operand shapes by XLA): forward, or a gradient by `jax.vjp`."""
        jax = self.jax
        conv = self._conv(strides, padding, dilation)
        if op == "conv2d":
            return jax.jit(conv)
        def input_gradient(dy, w):
            _, pullback = jax.vjp(lambda x: conv(x, w), jax.numpy.zeros(shape, dy.dtype))
            return pullback(dy)[0]

        def filter_gradient(x, dy):
            _, pullback = jax.vjp(lambda w: conv(x, w), jax.numpy.zeros(shape, x.dtype))
            return pullback(dy)[0]

        return jax.jit(input_gradient if op == "conv2d_backprop_input" else filter_gradient)

    def _call(self, op: str, first, second, shape, strides, padding, dilation) -> np.ndarray:
        fn = self._compiled(op, normalize_pair(strides, "strides"), _padding(padding),
                            normalize_pair(dilation, "dilation"), shape)
        return self._run(fn, first, second)

    def _run(self, fn, first, second) -> np.ndarray:
        device = self._device
        return np.asarray(fn(*(self.jax.device_put(np.asarray(a), device) for a in (first, second))))

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        return self._call("conv2d", x, w, None, strides, padding, dilation)

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        """dx as `jax.vjp` of the forward conv computes it (the transposed convolution)."""
        return self._call("conv2d_backprop_input", dy, w, tuple(int(v) for v in input_shape), strides, padding,
                          dilation)

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        """dw as `jax.vjp` of the forward conv computes it."""
        return self._call("conv2d_backprop_filter", x, dy, tuple(int(v) for v in filter_shape), strides, padding,
                          dilation)

    @functools.cached_property
    def _matmul(self):
        """jnp.matmul under this configuration, cast back to a's dtype, compiled once per shapes."""
        jnp, settings = self.jax.numpy, self._settings
        return self.jax.jit(lambda a, b: jnp.matmul(a, b, **settings).astype(a.dtype))

    def matmul(self, a, b):
        return self._run(self._matmul, a, b)

    def runtime_info(self) -> dict:
        """What this JAX process reports about itself (for provenance)."""
        jax = self.jax
        import jaxlib

        return {"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
                "devices": [str(d) for d in jax.devices()], "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "precision": self.precision, "preferred_element_type": self.preferred_element_type}

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device, "precision": self.precision,
                "preferred_element_type": self.preferred_element_type}
