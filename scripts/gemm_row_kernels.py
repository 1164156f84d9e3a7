"""Study: does the oneDNN-off fp16 GEMM's kernel depend on the row too?

TensorFlow's Eigen conv2d (oneDNN off, TF_CONV2D_USE_FP16_ACCUMULATE=1) is one fp16 GEMM,
patches (N*OH*OW, K) x filter (K, C_out), and its filter gradient one whose output is
(KH*KW*C, C_out). `identify` measures the kernel of each output tile, row block and
column block (`convprobe.identify.tile_patterns`); this script compares every row of real
TensorFlow's output (an output pixel, or a (tap, channel) of the filter gradient) with
each of the given specs and prints the rows that do not match, so a row block with a
kernel of its own shows, and a measured ``rows(...)`` spec can be checked row by row.

Run: python scripts/gemm_row_kernels.py [conv2d|conv2d_backprop_filter] [N,H,W,C] [KH,KW,C,COUT] [SPEC ...]
"""

from __future__ import annotations

import os
import sys

os.environ.update({"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})

import numpy as np  # noqa: E402

from convprobe import emulation as em  # noqa: E402
from convprobe.probes.layers import Layer, op_inputs, run_op  # noqa: E402

DEFAULT_SPECS = ["lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16)", "sequential:fp16:product=fp16"]


def main() -> None:
    from convprobe.backends.emulated import EmulatedBackend
    from convprobe.backends.tensorflow import TensorFlowBackend

    op = sys.argv[1] if len(sys.argv) > 1 else "conv2d"
    if op not in ("conv2d", "conv2d_backprop_filter"):
        sys.exit(f"op must be one of conv2d, conv2d_backprop_filter; received {op!r}")
    shape = tuple(int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1,7,7,16").split(","))
    fshape = tuple(int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "3,3,16,8").split(","))
    specs = sys.argv[4:] or DEFAULT_SPECS
    layer = Layer(shape, fshape)
    a, b = op_inputs(layer, op, 0)
    real = run_op(TensorFlowBackend(), layer, op, a, b).reshape(-1, fshape[3])
    print(f"{op} of layer {shape} * {fshape}: GEMM rows {real.shape[0]}, columns {real.shape[1]}")
    for spec in specs:
        em.parse_model(spec)  # a bad spec says so in one line
        model = run_op(EmulatedBackend(spec), layer, op, a, b).reshape(real.shape)
        equal = model.view(np.uint16) == real.view(np.uint16)
        rows = np.flatnonzero(~equal.all(axis=1))
        shown = ", ".join(map(str, rows[:12])) + (" ..." if len(rows) > 12 else "")
        print(f"  {spec}: {equal.mean():.4f} match; rows not matching: {len(rows)} [{shown}]")


if __name__ == "__main__":
    main()
