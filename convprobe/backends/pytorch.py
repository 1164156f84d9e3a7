"""PyTorch's convolutions, as a PyTorch user's training step runs them, under PyTorch's switches.

The forward op is `torch.nn.functional.conv2d` (NCHW, OIHW: the NHWC and HWIO arrays the
probes pass are permuted, which moves no value); its two gradients are what autograd
computes for it (`torch.autograd.grad`, the `convolution_backward` a training step runs).
A SAME padding PyTorch cannot express (asymmetric, or strided) is `torch.nn.functional.pad`
followed by an unpadded conv, as a PyTorch port of a TensorFlow layer does. The switches
are process-wide in PyTorch, set once when the backend first imports it (each
configuration runs in its own process):

- ``mkldnn``: ``torch.backends.mkldnn.enabled`` (oneDNN kernels on the CPU), on or off;
- ``compile``: ``inductor`` runs each op through ``torch.compile`` (its backward too, by
  AOTAutograd), and ``emulate_precision_casts``: Inductor's
  ``config.emulate_precision_casts`` (round fp16 intermediates as eager code would);
- ``float32_matmul_precision``: ``torch.set_float32_matmul_precision`` (highest, high, medium);
- on a GPU, ``fp16_reduced_precision_reduction`` and ``bf16_reduced_precision_reduction``
  (``torch.backends.cuda.matmul.allow_*_reduced_precision_reduction``), ``cudnn``
  (``torch.backends.cudnn.enabled``) and ``tf32`` (cuDNN's and cuBLAS's TF32 switches).

PyTorch is an optional extra (``pip install -e ".[torch]"``): without it this backend says
so in one line as an unsupported configuration.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

from convprobe.backends.base import AbstractBackend, normalize_pair
from convprobe.emulation.conv import resolve_padding
from convprobe.errors import UnsupportedConfiguration, invalid_choice

__all__ = ["TorchBackend", "SWITCHES", "torch_installed"]

#: Each switch a configuration may set, and the values it takes.
SWITCHES: dict[str, tuple[str, ...]] = {
    "mkldnn": ("on", "off"),
    "compile": ("inductor",),
    "emulate_precision_casts": ("on", "off"),
    "float32_matmul_precision": ("highest", "high", "medium"),
    "fp16_reduced_precision_reduction": ("on", "off"),
    "bf16_reduced_precision_reduction": ("on", "off"),
    "cudnn": ("on", "off"),
    "tf32": ("on", "off"),
}


def torch_installed() -> bool:
    """Whether PyTorch can be imported here, without importing it."""
    return importlib.util.find_spec("torch") is not None


class TorchBackend(AbstractBackend):
    """`torch.nn.functional.conv2d`, its two autograd gradients and `torch.matmul` on one device."""

    name = "torch"
    capabilities = frozenset({"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter", "matmul"})

    def __init__(self, device: str = "cpu", **switches: str):
        for switch, value in switches.items():
            if switch not in SWITCHES:
                raise invalid_choice("torch switch", switch, tuple(SWITCHES))
            if value not in SWITCHES[switch]:
                raise invalid_choice(switch, value, SWITCHES[switch])
        self.device = device
        self.switches = dict(switches)

    @functools.cached_property
    def torch(self):
        """PyTorch, its process-wide switches set (once: this process runs one configuration)."""
        if not torch_installed():
            raise UnsupportedConfiguration('PyTorch is not installed: pip install -e ".[torch]"')
        import torch

        if self.device == "gpu" and not torch.cuda.is_available():
            raise UnsupportedConfiguration("PyTorch sees no GPU in this process")
        on = {name: value == "on" for name, value in self.switches.items()}
        if "mkldnn" in on:
            torch.backends.mkldnn.enabled = on["mkldnn"]
        if "float32_matmul_precision" in self.switches:
            torch.set_float32_matmul_precision(self.switches["float32_matmul_precision"])
        if "emulate_precision_casts" in on:
            import torch._inductor.config as inductor

            inductor.emulate_precision_casts = on["emulate_precision_casts"]
        if "fp16_reduced_precision_reduction" in on:
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = on["fp16_reduced_precision_reduction"]
        if "bf16_reduced_precision_reduction" in on:
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = on["bf16_reduced_precision_reduction"]
        if "cudnn" in on:
            torch.backends.cudnn.enabled = on["cudnn"]
        if "tf32" in on:
            torch.backends.cudnn.allow_tf32 = on["tf32"]
            torch.backends.cuda.matmul.allow_tf32 = on["tf32"]
        return torch

    @functools.cached_property
    def _device(self):
        return self.torch.device("cuda" if self.device == "gpu" else "cpu")

    def _compiled(self, fn):
        """`fn` through `torch.compile` where the configuration asks for it (one compiled
        graph per shapes; no fallback to eager code past a recompile limit)."""
        if "compile" not in self.switches:
            return fn
        torch = self.torch
        limits = torch._dynamo.config  # identify asks many shapes: never drop to eager code past a limit
        limits.recompile_limit = limits.accumulated_recompile_limit = 1 << 20
        limits.fail_on_recompile_limit_hit = True
        return torch.compile(fn, backend=self.switches["compile"], dynamic=False)

    def _tensor(self, array, layout: tuple[int, ...]):
        """An NHWC (or HWIO) array as the NCHW (OIHW) tensor PyTorch takes."""
        return self.torch.from_numpy(np.ascontiguousarray(np.asarray(array).transpose(layout))).to(self._device)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one backend per process: its compiled ops live as long
    def _forward(self, strides, padding, dilation, spatial, kernel):
        """f(x, w) for NCHW x and OIHW w: the conv, explicitly padded where PyTorch's own padding cannot say it."""
        functional = self.torch.nn.functional
        (top, bottom), (left, right) = resolve_padding(padding, spatial, kernel, strides, dilation)

        def conv(x, w):
            groups = x.shape[1] // w.shape[1]
            if top == bottom and left == right:
                return functional.conv2d(x, w, stride=strides, padding=(top, left), dilation=dilation, groups=groups)
            return functional.conv2d(functional.pad(x, (left, right, top, bottom)), w, stride=strides,
                                     dilation=dilation, groups=groups)

        return self._compiled(conv)

    def _conv(self, x, w, strides, padding, dilation):
        strides, dilation = normalize_pair(strides, "strides"), normalize_pair(dilation, "dilation")
        if not isinstance(padding, str):  # validated (integers >= 0) before it keys the cache
            padding = resolve_padding(padding, tuple(x.shape[2:]), tuple(w.shape[2:]), strides, dilation)
        return self._forward(strides, padding, dilation, tuple(x.shape[2:]), tuple(w.shape[2:]))(x, w)

    @staticmethod
    def _nhwc(tensor) -> np.ndarray:
        """An NCHW result as the NHWC array the probes read."""
        return tensor.detach().cpu().permute(0, 2, 3, 1).numpy()

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        with self.torch.no_grad():
            return self._nhwc(self._conv(self._tensor(x, (0, 3, 1, 2)), self._tensor(w, (3, 2, 0, 1)), strides,
                                          padding, dilation))

    def conv2d_backprop_input(self, dy, w, input_shape, *, strides=1, padding="VALID", dilation=1):
        """dx as autograd computes it for the forward conv (linear in x: any x gives it)."""
        torch = self.torch
        n, h, width, c = (int(v) for v in input_shape)
        x = torch.zeros((n, c, h, width), dtype=self._tensor(dy, (0, 3, 1, 2)).dtype, device=self._device,
                        requires_grad=True)
        y = self._conv(x, self._tensor(w, (3, 2, 0, 1)), strides, padding, dilation)
        (dx,) = torch.autograd.grad(y, x, self._tensor(dy, (0, 3, 1, 2)))
        return self._nhwc(dx)

    def conv2d_backprop_filter(self, x, dy, filter_shape, *, strides=1, padding="VALID", dilation=1):
        """dw as autograd computes it for the forward conv (linear in w: any w gives it)."""
        torch = self.torch
        kh, kw, c, o = (int(v) for v in filter_shape)
        xt = self._tensor(x, (0, 3, 1, 2))
        w = torch.zeros((o, c, kh, kw), dtype=xt.dtype, device=self._device, requires_grad=True)
        y = self._conv(xt, w, strides, padding, dilation)
        (dw,) = torch.autograd.grad(y, w, self._tensor(dy, (0, 3, 1, 2)))
        return dw.detach().cpu().permute(2, 3, 1, 0).numpy()

    @functools.cached_property
    def _matmul(self):
        return self._compiled(self.torch.matmul)

    def matmul(self, a, b):
        with self.torch.no_grad():
            return self._matmul(*(self.torch.from_numpy(np.ascontiguousarray(v)).to(self._device)
                                  for v in (a, b))).cpu().numpy()

    def runtime_info(self) -> dict:
        """What this PyTorch process reports about itself (for provenance)."""
        torch = self.torch
        return {"torch_version": torch.__version__, "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
                "mkldnn_available": bool(torch.backends.mkldnn.is_available()),
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "cuda": torch.version.cuda, "switches": dict(self.switches),
                "device_name": torch.cuda.get_device_name() if self.device == "gpu" else None}

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device, **self.switches}
