"""Benchmark: what one column-layout call of `tile_patterns` costs on real TensorFlow.

The tile probe's budget (`tile_patterns.MAX_CALLS`, `MAX_WORK`) is set from these
numbers: milliseconds a call and multiply-adds a second (the GEMM's M N K a call), on
oneDNN-off fp16 accumulation, after the first call (which compiles).

Run: python scripts/tile_call_cost.py [CALLS]
"""

from __future__ import annotations

import os
import sys
import time

os.environ.update({"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})

import numpy as np  # noqa: E402

from convprobe.identify import tile_patterns  # noqa: E402
from convprobe.identify.column_patterns import column_count, column_k  # noqa: E402
from convprobe.probes.layers import Layer  # noqa: E402

LAYERS = [((1, 7, 7, 16), (3, 3, 16, 8), "conv2d"), ((1, 4, 4, 128), (3, 3, 128, 24), "conv2d"),
          ((1, 15, 15, 2), (3, 3, 2, 11), "conv2d_backprop_filter"), ((1, 16, 16, 1024), (1, 1, 1024, 8), "conv2d"),
          ((4, 32, 32, 3), (3, 3, 3, 16), "conv2d_backprop_filter"), ((1, 8, 8, 256), (3, 3, 256, 8), "conv2d")]


def main() -> None:
    from convprobe.backends.tensorflow import TensorFlowBackend

    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    backend = TensorFlowBackend()
    print(f"{'layer':32} {'op':24} {'ms/call':>8} {'GMAC/s':>7}")
    for shape, filters, op in LAYERS:
        at = tile_patterns.proxy(Layer(shape, filters))
        k, n = column_k(at, op), column_count(at, op)
        m = filters[0] * filters[1] * filters[2] if op == "conv2d_backprop_filter" else int(np.prod(at.output_shape[:3]))
        operand = np.ones((calls, n, k), np.float16)
        tile_patterns.column_layout_outputs(backend, at, op, operand[:2], 1.0)  # compiles
        start = time.perf_counter()
        tile_patterns.column_layout_outputs(backend, at, op, operand, 1.0)
        seconds = time.perf_counter() - start
        print(f"{str(shape) + ' * ' + str(filters):32} {op:24} {seconds / calls * 1e3:8.2f} "
              f"{m * n * k * calls / seconds / 1e9:7.2f}")


if __name__ == "__main__":
    main()
