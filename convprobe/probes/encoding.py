"""JSON-safe encoding of float arrays: values as strings ('inf', 'nan', '-0.0') and raw bits.

Standard JSON has no inf/NaN, and the sign of zero and NaN payloads matter here,
so observations carry both the value and the exact bit pattern.
"""

from __future__ import annotations

import numpy as np

__all__ = ["encode_values", "encode_bits", "decode_values"]


def encode_values(values: np.ndarray) -> list[str]:
    """Each element as repr(float): exact for fp16/fp32, and 'inf'/'nan' survive JSON."""
    return [repr(float(v)) for v in np.asarray(values).ravel()]


def encode_bits(values: np.ndarray) -> list[str]:
    """Each element's bit pattern in hex, e.g. '0x7c00' for fp16 +inf."""
    arr = np.ascontiguousarray(np.asarray(values))
    width = arr.dtype.itemsize
    as_uint = arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
    return [f"0x{int(v):0{2 * width}x}" for v in as_uint.ravel()]


def decode_values(encoded: list[str]) -> np.ndarray:
    """Inverse of `encode_values` (as float64)."""
    return np.array([float(v) for v in encoded], dtype=np.float64)
