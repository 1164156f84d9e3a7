"""Child-process task behind `ConvBackend.conv2d` for a framework's configurations
(TensorFlow, JAX, PyTorch).

Shaped like a probe module (`run`, `interpret`) so that the isolation layer and
the worker run it unchanged: arrays travel bit exact as base64 bytes.
"""

from __future__ import annotations

import numpy as np

from convprobe.testing.backends import decode_array, encode_array


def run(backend, *, x, w, strides=1, padding="VALID", dilation=1, **_params) -> dict:
    if not isinstance(padding, str):
        padding = [tuple(p) for p in padding]
    with np.errstate(all="ignore"):  # the caller decides what an overflow means
        y = backend.conv2d(decode_array(x), decode_array(w), strides=strides, padding=padding, dilation=dilation)
    return {"output": encode_array(np.asarray(y))}


def interpret(observed: dict) -> dict:
    return {"accumulation": "unknown", "arithmetic": "", "verdict": "conv2d output", "evidence": ""}
