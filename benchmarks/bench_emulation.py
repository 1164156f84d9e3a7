"""Benchmark: emulated conv2d on ResNet-20 layer shapes vs TensorFlow's native fp32 conv2d.

Run: ``python benchmarks/bench_emulation.py [--repeat 3] [--models sequential:fp16 ...]
[--models-from FILE ...]``

``--models-from`` adds every model an identify result reports: an identify document
(``convprobe identify ... --output map.json``: each op's best and perfect specs) or a
generated markdown page (``docs/battery-models-zen4.md``: every backticked spec). A
recovered tree sums the K of its own layer only; the layers here have other Ks, so trees
are listed as skipped.

Prints, per layer and in total, the best-of-N wall time and process CPU time of
each emulation model (timed round robin: N passes over all models) and of ``tf.nn.conv2d`` in fp32 on the same shapes, measured
in this one run, their ratios, and the peak memory of the emulator (NumPy
allocations via tracemalloc, plus the process's peak RSS before TensorFlow is
imported). CPU time is printed because shared machines make wall time noisy.

Floor: an exact emulation needs at least one multiply-add and one rounding per term.
On a CPU with AVX512-FP16 the default sequential fp16 model (and its addition=fp32
variant, toward zero, and the chunked fp16 model with an fp32 total) is exactly the
hardware's own fp16 fused multiply-add (or float32 multiply, add and one conversion), 32
(16) lanes per instruction, so its floor is the native kernel's: about 1x, plus the
im2col copy that oneDNN avoids. Without it (F16C only), every operation runs in 16
float32 lanes, as native's FMA does: nearest even needs per term a widening of w, a
multiply, TwoSum (6), the round-to-odd fix (about 5) and two conversions, about 15
operations against native's one, a floor near 15x; toward zero one float32 FMA, two
conversions and the overflow mark (about 5), near 5x. The block-FMA kernel on fp16/fp8
inputs runs in the same 16 float32/int32 lanes (512-bit vectors, which its kernel asks LLVM for):
per term an exponent add and max, two multiplies, a truncating conversion and an integer
add (6 operations), and per block and lane about 25 more (the running sum's exponent, two
powers of two, the rounding of an integer, overflow): 6 + 25 / b operations per term
against one, about 12x for b = 4 (V100), 9x for b = 8 (A100) and 7.5x for b = 16 (H100)
at equal instruction rates. The exact model on fp16 inputs splits each product by two
FMAs and a subtraction into two float64 sums (5 operations in 8 lanes, 10 against one),
near 10x plus one rounding per output. Lanes of the sequential fp32 model with a float32
combine run on native's own FMA (floor 1x, plus im2col and the row tile's transposition);
split-K of sequential fp16 combined in fp32 is sequential fp16's kernel with its chunk
totals kept (about 15x). Stochastic rounding of the sequential fp16 model runs in the same
16 float32/int32 lanes (`_native_stochastic`, random stream version 2): per term a
widening of w, a truncating float32 FMA, the draw (the Weyl step's add, lowbias32's two
32-bit multiplies, three shifts and three xors, then the shift to 13 bits: 10) and the
rounding (magnitude, compare and select for the subnormal lift, two adds, an integer add
and mask, the overflow compare and select, the sign: about 11), about 23 operations
against one. These counts are rough: measured, it costs 12-14x, less than sequential
fp16's 15 operations at about 15x (its TwoSum is a dependent chain of six adds; the draw
is independent of the running sum). Version 1's stream, SplitMix64 in 8 int64 lanes
with the rounding in float64, cost 65-91x.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import time
import tracemalloc

import numpy as np

from convprobe.emulation import conv2d, parse_model
from convprobe.errors import InvalidArgument

LAYERS = [  # (x NHWC, w HWIO): ResNet-20 stages at batch 32, 3x3, SAME
    ((32, 32, 32, 16), (3, 3, 16, 16)),
    ((32, 16, 16, 32), (3, 3, 32, 32)),
    ((32, 8, 8, 64), (3, 3, 64, 64)),
]
DEFAULT_MODELS = [  # the GPU presets and every model kind
    "v100", "a100", "h100", "blocked:fp16:b=4", "sequential:fp16", "sequential:fp16:addition=fp32",
    "sequential:fp16:rounding=toward_zero", "sequential:fp16:rounding=stochastic:seed=1", "exact:fp32",
    "chunked:fp16:n=64", "splitk(4, sequential:fp16, combine=fp32)", "lanes(8, sequential:fp32, combine=pairwise:fp32)",
]


def reported_models(path: str) -> list[str]:
    """Every model spec an identify document or a generated markdown page reports, in order."""
    text = open(path, encoding="utf-8").read()
    if path.endswith(".json"):
        specs = []
        for ops in json.loads(text).get("matches", {}).values():
            for entry in ops.values():
                summary = (entry or {}).get("summary") or {}
                specs += [summary.get("best"), *summary.get("perfect", ())]
                specs += [per_k.get("best") for per_k in (summary.get("per_k") or {}).values()]
    else:
        specs = re.findall(r"`([^`]+)`", text)
    out = []
    for spec in specs:
        if not spec or spec in out:
            continue
        try:
            parse_model(spec)
        except (InvalidArgument, ValueError, TypeError):
            continue
        out.append(spec)
    return out


def inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for xs, ws in LAYERS:
        x = rng.standard_normal(xs).astype(np.float16)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[:3]))).astype(np.float16)
        out.append((x, w))
    return out


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def best(fn, repeat: int) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds) over `repeat` calls."""
    times = [timed(fn) for _ in range(repeat)]
    return min(t[0] for t in times), min(t[1] for t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--models-from", nargs="*", default=(), metavar="FILE")
    args = parser.parse_args()
    data = inputs()
    specs = list(args.models if args.models is not None else ([] if args.models_from else DEFAULT_MODELS))
    for path in args.models_from:
        specs += [spec for spec in reported_models(path) if spec not in specs]
    models = {}
    for spec in specs:
        model = parse_model(spec)
        if getattr(model, "kind", "") == "tree" or "tree(" in spec:
            print(f"skipped (a tree of its own layer's K): {spec[:100]}")
            continue
        models[spec] = model
    peak_np: dict[str, int] = {}
    for spec, model in models.items():
        for x, w in data:  # compile / load the numba cache outside the timing
            conv2d(x[:1], w, model, padding="SAME")
        tracemalloc.start()
        for x, w in data:
            conv2d(x, w, model, padding="SAME")
        peak_np[spec] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # Round robin: each pass times every model once, so a slow spell of a shared machine
    # spreads over the models instead of landing on one; each keeps its best time per layer.
    passes = [{spec: [timed(lambda: conv2d(x, w, model, padding="SAME")) for x, w in data]
               for spec, model in models.items()} for _ in range(args.repeat)]
    emu = {spec: [(min(p[spec][i][0] for p in passes), min(p[spec][i][1] for p in passes))
                  for i in range(len(data))] for spec in models}
    rss_before_tf = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    import tensorflow as tf  # noqa: PLC0415 - the benchmark's baseline only

    native = []
    for x, w in data:
        xt, wt = tf.constant(x.astype(np.float32)), tf.constant(w.astype(np.float32))
        for _ in range(3):
            tf.nn.conv2d(xt, wt, 1, "SAME").numpy()
        native.append(best(lambda: tf.nn.conv2d(xt, wt, 1, "SAME").numpy(), max(args.repeat, 20)))

    print(f"TensorFlow {tf.__version__}, NumPy {np.__version__}; best of {args.repeat} "
          f"(native: best of {max(args.repeat, 20)})")
    print(f"{'model':44s} {'layer':18s} {'wall s':>9s} {'x native':>9s} {'cpu s':>9s} "
          f"{'x native':>9s}")
    nat_wall = sum(t[0] for t in native)
    nat_cpu = sum(t[1] for t in native)
    for i, (xs, _) in enumerate(LAYERS):
        print(f"{'tf.nn.conv2d fp32':44s} {str(xs[1:]):18s} {native[i][0]:9.4f} {1:9.1f} "
              f"{native[i][1]:9.4f} {1:9.1f}")
    for spec, rows in emu.items():
        for i, (xs, _) in enumerate(LAYERS):
            wall, cpu = rows[i]
            print(f"{spec:44s} {str(xs[1:]):18s} {wall:9.4f} {wall / native[i][0]:9.1f} "
                  f"{cpu:9.4f} {cpu / max(native[i][1], 1e-9):9.1f}")
        wall, cpu = sum(r[0] for r in rows), sum(r[1] for r in rows)
        print(f"{spec:44s} {'TOTAL':18s} {wall:9.4f} {wall / nat_wall:9.1f} {cpu:9.4f} "
              f"{cpu / max(nat_cpu, 1e-9):9.1f}   peak NumPy memory "
              f"{peak_np[spec] / 2**20:.1f} MiB")
    print(f"native TOTAL wall {nat_wall:.4f} s, cpu {nat_cpu:.4f} s; process peak RSS before "
          f"importing TensorFlow: {rss_before_tf / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
