"""How many outputs of Winograd and FFT convolutions each direct-sum test changes.

Runs `convprobe.identify.direct_sum.probe` on the transform convolutions of
`convprobe/backends/transformed.py` (F(2x2, 3x3) and F(4x4, 3x3) with fp16, fp32 or fp64
transforms; FFTs in fp32 and fp64) at a few layers, for the forward conv and the
gradients, over seeds, and prints each test's counts per seed:

    python scripts/direct_sum_transforms.py [--seeds 6]
"""

import argparse

import numpy as np

from convprobe.backends.transformed import FFTBackend, WinogradBackend
from convprobe.identify import direct_sum
from convprobe.probes.layers import Layer

FORWARD = [Layer((1, 10, 10, 16), (3, 3, 16, 8), padding="VALID"), Layer((1, 6, 6, 64), (3, 3, 64, 2), padding="VALID"),
           Layer((2, 14, 14, 32), (3, 3, 32, 1), padding="VALID")]
GRADIENTS = Layer((1, 12, 12, 16), (3, 3, 16, 8), padding="VALID")  # dx tiles by 4, dy (10 x 10) by 2
CASES = [(layer, "conv2d") for layer in FORWARD] + [(GRADIENTS, "conv2d_backprop_input"),
                                                     (GRADIENTS, "conv2d_backprop_filter")]
BACKENDS = {"F(2,3) fp16": WinogradBackend(2), "F(2,3) fp32": WinogradBackend(2, np.float32),
            "F(2,3) fp64": WinogradBackend(2, np.float64), "F(4,3) fp16": WinogradBackend(4),
            "F(4,3) fp32": WinogradBackend(4, np.float32), "F(4,3) fp64": WinogradBackend(4, np.float64),
            "FFT fp32": FFTBackend(np.float32), "FFT fp64": FFTBackend(np.float64)}


def _applies(name: str, layer: Layer, op: str) -> bool:
    """Winograd here has no filter gradient, and F(4x4, 3x3) tiles only outputs that are
    a multiple of 4 (the image, for the input gradient)."""
    if name.startswith("F(") and op == "conv2d_backprop_filter":
        return False
    tiled = layer.input_shape[1:3] if op == "conv2d_backprop_input" else [size - 2 for size in layer.input_shape[1:3]]
    return not name.startswith("F(4") or all(size % 4 == 0 for size in tiled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    seeds = range(parser.parse_args().seeds)
    print(f"rescaling by 2**+-{direct_sum.EXPONENT}, outside values [0.5, 1) * {direct_sum.OUTSIDE:g}")
    print("| layer | op | transform | outputs | changed by rescaling | changed by outside values | changed at ties | "
          "direct |")
    print("|---|---|---|---|---|---|---|---|")
    for layer, op in CASES:
        for name, backend in BACKENDS.items():
            if not _applies(name, layer, op):
                continue
            found = [direct_sum.probe(backend, layer, op, seed) for seed in seeds]
            rescaled = ", ".join(str(f.changed_by_rescaling) for f in found)
            outside = ", ".join(str(f.changed_by_outside) for f in found)
            ties = ", ".join(str(f.changed_at_ties) for f in found)
            verdicts = ", ".join(sorted({str(f.direct) for f in found}))
            print(f"| {layer.label} | {op} | {name} | {found[0].outputs} | {rescaled} | {outside} of "
                  f"{found[0].outside_outputs} | {ties} of {found[0].tie_outputs} | {verdicts} |")


if __name__ == "__main__":
    main()
