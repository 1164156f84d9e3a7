"""Benchmark: `convprobe.emulation.dot` against conv2d's cost per multiply-add, same model.

Run: ``python benchmarks/bench_dot.py [--repeat 3] [--models SPEC ...]``

A 1x1 convolution is a GEMM; `dot` reduces independent rows. Both run the same model's
arithmetic, so their cost per multiply-add should be close: the goal is `dot` within 1.5x
of conv2d. Per model it prints the best-of-N process CPU time of conv2d on x (1, 16, 16, K)
against w (1, 1, K, N) and of `dot` on R = 16 * 16 * N rows of K terms (the same number of
multiply-adds), seeded fp16 operands, both measured in this one run, and their ratio.
CPU time is printed because shared machines make wall time noisy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from convprobe.emulation import conv2d, dot, parse_model

K, N, SIDE = 576, 32, 16  # ResNet-20's last stage: 3 x 3 x 64 terms per output
DEFAULT_MODELS = [
    "sequential:fp16", "sequential:fp32:output=fp16", "chunked:fp16:n=512:addition=fp32:total=fp16",
    "splitk(length=320, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
    "lanes:fp16:w=8:then=pairwise", "pairwise:fp16", "v100", "a100",
]


def cpu_time(fn, repeat: int) -> float:
    """Best process CPU seconds of `repeat` calls."""
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((1, SIDE, SIDE, K)).astype(np.float16)
    w = (rng.standard_normal((1, 1, K, N)) / np.sqrt(K)).astype(np.float16)
    rows = SIDE * SIDE * N
    a = rng.standard_normal((rows, K)).astype(np.float16)
    b = (rng.standard_normal((rows, K)) / np.sqrt(K)).astype(np.float16)
    macs = rows * K
    print(f"seed {args.seed}; conv2d x {x.shape} w {w.shape} and dot of {rows} rows of K = {K}: "
          f"{macs} multiply-adds each; best of {args.repeat}, process CPU time")
    print(f"{'model':44s} {'conv2d s':>9s} {'dot s':>9s} {'ns/MAC conv':>12s} {'ns/MAC dot':>11s} {'dot/conv':>9s}")
    for spec in args.models:
        model = parse_model(spec)
        with np.errstate(all="ignore"):
            conv2d(x, w, model)  # compile / load the numba cache outside the timing
            dot(a[:64], b[:64], model)
            conv_s = cpu_time(lambda: conv2d(x, w, model), args.repeat)
            dot_s = cpu_time(lambda: dot(a, b, model), args.repeat)
        print(f"{spec[:44]:44s} {conv_s:9.4f} {dot_s:9.4f} {conv_s / macs * 1e9:12.2f} {dot_s / macs * 1e9:11.2f} "
              f"{dot_s / conv_s:9.2f}")


if __name__ == "__main__":
    main()
