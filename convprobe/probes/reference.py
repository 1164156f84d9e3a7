"""A float64 reference convolution that shares no code with any backend.

Used as "the truth" by probes on data whose products and sums float64 holds to
~1e-16 relative: good enough to measure fp16/fp32 errors, independent of both
the emulator and the framework under test.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["conv2d_float64"]


def conv2d_float64(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """VALID, stride-1 NHWC x HWIO convolution (cross-correlation) in float64."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    kh, kw, _, _ = w.shape
    patches = sliding_window_view(x, (kh, kw), axis=(1, 2))  # N, H', W', C, kh, kw
    return np.einsum("nhwcij,ijco->nhwo", patches, w, optimize=True)
