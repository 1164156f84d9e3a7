"""Study: the oneDNN-off fp16 input gradient of a layer with few input channels.

TensorFlow's Eigen input gradient (oneDNN off, TF_CONV2D_USE_FP16_ACCUMULATE=1) forms
col = dy (N*OH*OW, C_out) x filter^T (C_out, KH*KW*C) in fp16 and scatters col into
dx in fp16 (col2im), taps in the order the emulator's rotated filter gives. This script
tests the hypothesis that the GEMM's arithmetic depends on the column of col: columns in
whole blocks of 16 round each product to fp16 and add in fp16; a following block of 8
sums in two interleaved fp16 lanes; the last columns (fewer than 8) are an fp16 FMA-like
chain. Each tap's partial sums come from the emulator with the filter zeroed elsewhere,
are combined in fp16 in the emulator's tap order, and are compared with real TensorFlow.
Last it measures the columns on TensorFlow itself (`convprobe.identify.column_patterns`)
and runs the one spec they give through the emulator's input gradient.

Run: python scripts/input_gradient_columns.py [N,H,W,C] [KH,KW,C,COUT] [seed]
"""

from __future__ import annotations

import os
import sys

os.environ.update({"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})

import numpy as np  # noqa: E402

from convprobe import emulation as em  # noqa: E402
from convprobe.identify.column_patterns import column_model, column_models, measure_columns  # noqa: E402
from convprobe.probes.layers import Layer, op_inputs  # noqa: E402

#: The hypothesis: the micro kernel of an fp16 GEMM column by block (whole blocks of 16,
#: the next block of 8, the rest), and the two kernels for the rest it compares.
WHOLE_16 = "sequential:fp16:product=fp16"
NEXT_8 = "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16)"
REST = {"exact products": "sequential:fp16", "addition=fp32": "sequential:fp16:addition=fp32"}


def column_kernel(column: int, columns: int, rest: str) -> str:
    """The hypothesis's kernel of GEMM column `column` of `columns`."""
    whole16 = columns // 16 * 16
    if column < whole16:
        return WHOLE_16
    return NEXT_8 if column < whole16 + (columns - whole16) // 8 * 8 else rest


def main() -> None:
    import tensorflow as tf

    shape = tuple(int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4,32,32,3").split(","))
    fshape = tuple(int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "3,3,3,16").split(","))
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    layer = Layer(shape, fshape)
    kh, kw, c_in, _ = fshape
    dy, w = op_inputs(layer, "conv2d_backprop_input", seed)
    real = tf.raw_ops.Conv2DBackpropInput(input_sizes=list(shape), filter=w, out_backprop=dy, strides=[1, 1, 1, 1],
                                          padding="SAME").numpy()
    plain = em.conv2d_backprop_input(dy, w, shape, em.parse_model(f"chunked:fp16:n={fshape[3]}:product=fp16:"
                                                                  f"total=fp16"), padding="SAME")
    print(f"layer {shape} * {fshape}, seed {seed}; GEMM columns KH*KW*C = {kh * kw * c_in}")
    print(f"  one-tap chunks for every column: {np.mean(plain.view(np.uint16) == real.view(np.uint16)):.4f} match")
    taps = [(i, j) for i in range(kh) for j in range(kw)][::-1]  # the rotated filter's order
    for rest_name, rest in REST.items():
        total = np.zeros(shape, np.float16)
        for i, j in taps:
            for c in range(c_in):
                spec = column_kernel((i * kw + j) * c_in + c, kh * kw * c_in, rest)
                wt = np.zeros_like(w)
                wt[i, j, c] = w[i, j, c]
                part = em.conv2d_backprop_input(dy, wt, shape, em.parse_model(spec), padding="SAME")[..., c]
                total[..., c] = (total[..., c] + part.astype(np.float16)).astype(np.float16)
        match = np.mean(total.view(np.uint16) == real.view(np.uint16))
        print(f"  columns by block (16: products rounded; 8: two lanes; rest: {rest_name}): {match:.4f} match")
    from convprobe.backends.tensorflow import TensorFlowBackend

    runs, note = measure_columns(TensorFlowBackend(), layer, "conv2d_backprop_input")
    print(f"  measured column by column: {[(run.first, candidate) for run, candidate in zip(runs, column_specs(runs, fshape[3]))]}"
          f"{note}")
    model = column_models(layer, "conv2d_backprop_input", runs)
    if model is not None:  # identify's measured model, through the emulator's own input gradient
        ours = em.conv2d_backprop_input(dy, w, shape, model, padding="SAME")
        print(f"  the measured spec (column_patterns.column_models): "
              f"{np.mean(ours.view(np.uint16) == real.view(np.uint16)):.4f} match")


def column_specs(runs, k: int) -> list[str]:
    """Each run's measured spec (a column reduces K = C_out terms)."""
    return [model.to_spec() if (model := column_model(run.structure, k)) else "no spec" for run in runs]


if __name__ == "__main__":
    main()
