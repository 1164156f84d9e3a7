"""Benchmark: the overhead of `UnderflowTelemetry(every=10)` on a user's Keras `fit`.

Run: ``python benchmarks/bench_callback.py [--steps 40] [--repeats 10] [--batch-size 32]
[--image-size 32] [--width 32] [--every 10] [--jit]``

The goal (issue 43): fit steps with the callback at every=10 cost at most 1.10x plain
`fit` steps. One process builds a small user model (Conv2D, BatchNormalization, Conv2D,
BatchNormalization, Dense under mixed_float16 with a LossScaleOptimizer) twice with the
same seed, then alternates fits of `--steps + 1` steps, plain and with the callback,
`--repeats` times each, each plain fit paired with the callback's fit beside it, in
alternating order (plain first, then the callback first: a machine that slows down or
speeds up through the run moves the pairs' ratios both ways instead of one). A
timing callback (last in the list, so the telemetry callback's
own hooks are inside its intervals) stamps every step's end; step 0 of each fit (tracing)
is dropped, so the steps kept hold exactly one measured step in `every`. It prints the
process CPU time (every thread) and the wall time per step of both arms, and the ratio as
the median of the pairs' ratios (with their range): two fits run back to back share the
machine's load, so a pair's ratio is steadier than a ratio of medians; on a shared machine
CPU time is also the steadier of the two clocks. The cost
of a measured step is the fp32 shadow's pass plus per-tensor statistics and records, so the
ratio grows as layers shrink. Forty steps per fit hold four measured ones (with twenty, one
slow measured step moved a pair's ratio by several percent). Ten pairs, not six: on a 2-core
machine shared with other tenants single pairs read from 0.87x to 1.65x within one run, and the
median of six moved by several percent from run to run (1.019x to 1.149x in one session).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def build(args):
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    x = keras.Input((args.image_size, args.image_size, 3))
    h = x
    for i, filters in enumerate((args.width, 2 * args.width)):
        h = keras.layers.Conv2D(filters, 3, padding="same", strides=1 + i, name=f"conv{i}")(h)
        h = keras.layers.BatchNormalization(name=f"bn{i}")(h)
        h = keras.layers.ReLU(name=f"relu{i}")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    h = keras.layers.Dense(10, name="dense")(h)
    y = keras.layers.Activation("linear", dtype="float32", name="logits")(h)
    keras.mixed_precision.set_global_policy("float32")
    model = keras.Model(x, y)
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=bool(args.jit))
    return model


def main() -> None:
    import keras

    from convprobe.training import UnderflowTelemetry

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per fit (default 40)")
    parser.add_argument("--repeats", type=int, default=10, help="pairs of fits (default 10: five in each order)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--width", type=int, default=32, help="channels of the first conv (the second has twice)")
    parser.add_argument("--jit", action="store_true", help="compile the step with XLA (default off)")
    args = parser.parse_args()

    class Stamps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.cpu.append(time.process_time())
            self.wall.append(time.perf_counter())

        def on_train_begin(self, logs=None):
            self.cpu, self.wall = [], []

    rng = np.random.default_rng(0)
    n = (args.steps + 1) * args.batch_size
    xs = rng.normal(size=(n, args.image_size, args.image_size, 3)).astype("float32")
    ys = rng.integers(0, 10, n)
    models = {"plain": build(args), "callback": build(args)}
    per_step = {arm: {"cpu": [], "wall": []} for arm in models}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            order = list(models) if repeat % 2 == 0 else list(models)[::-1]  # ABBA: a drift cancels
            for arm in order:
                model = models[arm]
                stamps = Stamps()
                callbacks = [stamps] if arm == "plain" else [
                    UnderflowTelemetry(Path(scratch) / f"run{repeat}", every=args.every), stamps]
                model.fit(xs, ys, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False,
                          callbacks=callbacks)
                for clock in ("cpu", "wall"):
                    times = getattr(stamps, clock)
                    per_step[arm][clock].append((times[-1] - times[0]) / (len(times) - 1))  # steps 1..N
    print(f"UnderflowTelemetry(every={args.every}) on a Conv2D({args.width})/BN/Conv2D({2 * args.width})/BN/Dense "
          f"model, mixed_float16, batch "
          f"{args.batch_size}, {args.image_size}x{args.image_size}, XLA {'on' if args.jit else 'off'}; "
          f"{args.steps} steps per fit (1 in {args.every} measured), median of {args.repeats} repeats")
    for clock in ("cpu", "wall"):
        plain, with_callback = per_step["plain"][clock], per_step["callback"][clock]
        ratios = [c / p for p, c in zip(plain, with_callback)]
        print(f"  {clock:4s} per step: plain {statistics.median(plain) * 1e3:.2f} ms, with the callback "
              f"{statistics.median(with_callback) * 1e3:.2f} ms; ratio {statistics.median(ratios):.3f}x "
              f"(median of {len(ratios)} pairs, {min(ratios):.3f} to {max(ratios):.3f})")


if __name__ == "__main__":
    main()
