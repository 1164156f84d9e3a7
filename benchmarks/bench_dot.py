"""Benchmark: `convprobe.emulation.dot` against conv2d's cost per multiply-add, same model.

Run: ``python benchmarks/bench_dot.py [--repeat 3] [--models SPEC ...]``

A 1x1 convolution is a GEMM. `dot` computes the same GEMM when its operands broadcast as
one (a (M, 1, K) against b (N, K)), and then takes the convolutions' kernels; otherwise it
reduces independent rows, each with its own two operands. The goal is `dot` within 1.5x of
conv2d per multiply-add. Per model it prints the best-of-N process CPU time of conv2d on x
(1, 16, 16, K) against w (1, 1, K, N), of `dot` on the same GEMM (x's 256 rows against w's
N columns), and of `dot` on R = 16 * 16 * N independent rows of K terms (the same number of
multiply-adds), seeded fp16 operands, all measured in this one run, and the ratios.
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
    gemm_a, gemm_b = x.reshape(SIDE * SIDE, 1, K), np.ascontiguousarray(w.reshape(K, N).T)
    print(f"{'model':44s} {'conv2d s':>9s} {'dot GEMM s':>11s} {'dot rows s':>11s} {'ns/MAC conv':>12s} "
          f"{'ns/MAC GEMM':>12s} {'ns/MAC rows':>12s} {'GEMM/conv':>10s} {'rows/conv':>10s}")
    for spec in args.models:
        model = parse_model(spec)
        with np.errstate(all="ignore"):
            conv2d(x, w, model)  # compile / load the numba cache outside the timing
            dot(a[:64], b[:64], model)
            dot(gemm_a[:8], gemm_b, model)
            conv_s = cpu_time(lambda: conv2d(x, w, model), args.repeat)
            gemm_s = cpu_time(lambda: dot(gemm_a, gemm_b, model), args.repeat)
            dot_s = cpu_time(lambda: dot(a, b, model), args.repeat)
        per_mac = [seconds / macs * 1e9 for seconds in (conv_s, gemm_s, dot_s)]
        print(f"{spec[:44]:44s} {conv_s:9.4f} {gemm_s:11.4f} {dot_s:11.4f} {per_mac[0]:12.2f} {per_mac[1]:12.2f} "
              f"{per_mac[2]:12.2f} {gemm_s / conv_s:10.2f} {dot_s / conv_s:10.2f}")


if __name__ == "__main__":
    main()
