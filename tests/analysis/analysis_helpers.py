"""Shared helpers for the analysis tests (imported by the test modules; no __init__ needed)."""

from __future__ import annotations

import numpy as np

from convprobe.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, Format

_UINT = {1: np.uint8, 2: np.uint16}

#: Formats small enough to test exhaustively (every encoding).
EXHAUSTIVE = [FP8_E4M3, FP8_E5M2, BF16, FP16]


def all_values(fmt: Format) -> np.ndarray:
    """Every encoding of a <= 16-bit format, in code order, as its storage dtype."""
    uint = _UINT[fmt.dtype.itemsize]
    return np.arange(2 ** (8 * fmt.dtype.itemsize), dtype=np.uint64).astype(uint).view(fmt.dtype)


def widen(values: np.ndarray) -> np.ndarray:
    """float64 copy; signalling-NaN encodings (bf16, fp16) would warn in the cast."""
    with np.errstate(invalid="ignore"):
        return values.astype(np.float64)


def ids(fmt: Format) -> str:
    return fmt.name
