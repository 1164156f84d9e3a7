"""How many outputs of Winograd and FFT convolutions each direct-sum test changes.

Runs `convprobe.probes.direct_sum.probe` on the transform convolutions of
`tests/transform_convs.py` (F(2x2, 3x3) and F(4x4, 3x3) with fp16 or fp32 transforms;
FFTs in fp32 and fp64) at a few layers, over seeds, and prints the counts per seed:

    python scripts/direct_sum_transforms.py [--seeds 6]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from transform_convs import FFTBackend, WinogradBackend  # noqa: E402

from convprobe.probes import direct_sum  # noqa: E402
from convprobe.probes.layers import Layer  # noqa: E402

LAYERS = [Layer((1, 10, 10, 16), (3, 3, 16, 8), padding="VALID"), Layer((1, 6, 6, 64), (3, 3, 64, 2), padding="VALID"),
          Layer((2, 14, 14, 32), (3, 3, 32, 1), padding="VALID")]
BACKENDS = {"F(2,3) fp16": WinogradBackend(2), "F(2,3) fp32": WinogradBackend(2, np.float32),
            "F(4,3) fp16": WinogradBackend(4), "F(4,3) fp32": WinogradBackend(4, np.float32),
            "FFT fp32": FFTBackend(np.float32), "FFT fp64": FFTBackend(np.float64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    seeds = range(parser.parse_args().seeds)
    print(f"rescaling by 2**+-{direct_sum.EXPONENT}, outside values [0.5, 1) * {direct_sum.OUTSIDE:g}")
    print("| layer | transform | outputs | changed by rescaling | changed by outside values | direct |")
    print("|---|---|---|---|---|---|")
    for layer in LAYERS:
        for name, backend in BACKENDS.items():
            if name.startswith("F(4") and any((size - 2) % 4 for size in layer.input_shape[1:3]):
                continue  # F(4x4, 3x3) tiles only outputs that are a multiple of 4
            found = [direct_sum.probe(backend, layer, "conv2d", seed) for seed in seeds]
            rescaled = ", ".join(str(f.changed_by_rescaling) for f in found)
            outside = ", ".join(str(f.changed_by_outside) for f in found)
            verdicts = ", ".join(sorted({str(f.direct) for f in found}))
            print(f"| {layer.label} | {name} | {found[0].outputs} | {rescaled} | {outside} of "
                  f"{found[0].outside_outputs} | {verdicts} |")


if __name__ == "__main__":
    main()
