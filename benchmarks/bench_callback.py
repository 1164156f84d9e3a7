"""Benchmark: the overhead of `UnderflowTelemetry(every=10)` on a user's Keras `fit`.

Run: ``python benchmarks/bench_callback.py [--steps 400] [--batch-size 32] [--image-size 32]
[--width 32] [--every 10] [--jit]`` (``--steps``: timed steps per arm, after the warm-up)

The goal (issue 43): fit steps with the callback at every=10 cost at most 1.10x plain
`fit` steps. Two processes build the same small user model (Conv2D, BatchNormalization,
Conv2D, BatchNormalization, Dense under mixed_float16 with a LossScaleOptimizer, same seed)
and fit it, one plain, one with the callback, in lock step: a
process runs one step, then waits on a semaphore while the other runs its step. Each
process times its own steps with its own CPU clock (every thread of the process) and the
wall clock, from the start of the step's first callback hook to the end of its last (the
telemetry callback's hooks are inside). Steps 0 to `every` are a warm-up, not timed: step 0
traces the train function, and under XLA the callback's second train function (the one
that does not measure) is traced and compiled at step 1. The `--steps` timed steps that
follow are read in windows of `every` (steps every+1..2*every, ...), each holding exactly
one measured step, and a window's ratio is the callback's steps over the plain steps of the
same numbers, which ran interleaved with them, a few milliseconds apart. The ratio printed
is the median of the windows' ratios (with their range) and the ratio of the totals.

Why lock step: on a shared 2-core machine one process's CPU time for the same work moves
by tens of percent from second to second (other tenants share the cores), so plain and
callback fits run one after the other (the method before) read single pairs from 0.87x to
1.65x, and the median of ten pairs moved from 1.008x to 1.149x across runs. Steps
interleaved one by one share the machine's state; the two processes never run a step at
once. The cost of a measured step is the fp32 shadow's pass plus per-tensor statistics and
records, so the ratio grows as layers shrink.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import statistics
import tempfile
import time
from enum import StrEnum
from pathlib import Path

import numpy as np

from convprobe.cli.options import positive_int

#: Seconds a process waits for the other's step before it gives up (a partner that hangs), and
#: the main process for an arm to end once the other has failed.
_PATIENCE = 600


class Arm(StrEnum):
    """The two fits: without the callback, and with it."""

    PLAIN = "plain"
    CALLBACK = "callback"


def build(args):
    """The benchmark's user model, compiled; the same weights in every process (seed 0)."""
    import keras  # (here, not at the top: the parent process never loads TensorFlow)

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


def run_arm(arm, args, mine, theirs, failed, scratch, results):
    """One process's fit: wait for `mine` before each step, release `theirs` after it; put the
    per-step (cpu, wall) seconds on `results`, or the error, and then set `failed`."""
    import keras  # (here, not at the top: the parent process never loads TensorFlow)

    from convprobe.training import UnderflowTelemetry

    class Enter(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            waited = 0
            while not mine.acquire(timeout=1):
                waited += 1
                if failed.is_set() or waited >= _PATIENCE:
                    raise RuntimeError("the other arm stopped" if failed.is_set() else
                                       f"the other arm ran no step for {_PATIENCE} s")
            self.begin = (time.process_time(), time.perf_counter())

    class Leave(keras.callbacks.Callback):
        def __init__(self, enter):
            super().__init__()
            self.enter, self.steps = enter, []

        def on_train_batch_end(self, batch, logs=None):
            cpu, wall = time.process_time(), time.perf_counter()
            self.steps.append((cpu - self.enter.begin[0], wall - self.enter.begin[1]))
            theirs.release()

    try:
        model = build(args)
        rng = np.random.default_rng(0)
        n = (args.every + 1 + args.steps) * args.batch_size  # the warm-up, then the timed steps
        xs = rng.normal(size=(n, args.image_size, args.image_size, 3)).astype("float32")
        ys = rng.integers(0, 10, n)
        enter = Enter()
        leave = Leave(enter)
        telemetry = [UnderflowTelemetry(Path(scratch) / "run", every=args.every)] if arm == Arm.CALLBACK else []
        model.fit(xs, ys, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False,
                  callbacks=[enter, *telemetry, leave])
        results.put((arm, leave.steps))
    except BaseException as error:
        failed.set()  # the other arm must not wait for a step that will not come
        results.put((arm, f"{type(error).__name__}: {error}"))


def timed(steps, every):
    """`steps` after the warm-up (steps 0 to `every`), whole windows of `every` steps only."""
    kept = steps[every + 1:]
    return kept[: len(kept) // every * every]


def windows(steps, every):
    """Sums of the timed `steps` over consecutive windows of `every` steps."""
    kept = timed(steps, every)
    return [sum(kept[i:i + every]) for i in range(0, len(kept), every)]


def collect(processes, results, failed) -> dict:
    """Each arm's steps, or why it has none: its error, its exit code (a process killed outright
    puts nothing), or that it was stopped, still running `_PATIENCE` s after the other failed."""
    steps: dict = {}
    failed_at = None
    while len(steps) < len(processes):
        try:
            arm, value = results.get(timeout=5)
            steps[arm] = value
        except queue.Empty:
            for arm, process in processes.items():
                if arm not in steps and process.exitcode not in (None, 0):
                    steps[arm] = f"its process exited with code {process.exitcode}"
                    failed.set()
        if failed.is_set():
            failed_at = failed_at or time.monotonic()
            if time.monotonic() - failed_at > _PATIENCE:
                for arm, process in processes.items():
                    if arm not in steps:
                        process.terminate()
                        steps[arm] = f"stopped: still running {_PATIENCE} s after the other arm failed"
    for process in processes.values():
        process.join(timeout=_PATIENCE)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=400,
                        help="timed steps per arm, after the warm-up (default 400: 40 windows at every=10)")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--image-size", type=positive_int, default=32)
    parser.add_argument("--every", type=positive_int, default=10)
    parser.add_argument("--width", type=positive_int, default=32, help="channels of the first conv (the second has twice)")
    parser.add_argument("--jit", action="store_true", help="compile the step with XLA (default off)")
    args = parser.parse_args()
    if args.steps < args.every:
        parser.error(f"--steps must be at least --every ({args.every}: one window); received {args.steps}")

    context = multiprocessing.get_context("spawn")
    turns = {Arm.PLAIN: context.Semaphore(1), Arm.CALLBACK: context.Semaphore(0)}  # plain's step first
    results, failed = context.Queue(), context.Event()
    with tempfile.TemporaryDirectory() as scratch:
        processes = {arm: context.Process(target=run_arm, args=(arm, args, turns[arm], turns[other], failed, scratch,
                                                                 results))
                     for arm, other in ((Arm.PLAIN, Arm.CALLBACK), (Arm.CALLBACK, Arm.PLAIN))}
        for process in processes.values():
            process.start()
        steps = collect(processes, results, failed)
    errors = {arm: s for arm, s in steps.items() if isinstance(s, str)}
    if errors:
        raise SystemExit("; ".join(f"the {arm} arm failed: {message}" for arm, message in errors.items()))

    print(f"UnderflowTelemetry(every={args.every}) on a Conv2D({args.width})/BN/Conv2D({2 * args.width})/BN/Dense "
          f"model, mixed_float16, batch {args.batch_size}, {args.image_size}x{args.image_size}, "
          f"XLA {'on' if args.jit else 'off'}; in lock step, {args.every + 1} warm-up steps and "
          f"{len(timed(steps[Arm.PLAIN], args.every))} timed steps per arm (1 in {args.every} measured)")
    for clock, column in (("cpu", 0), ("wall", 1)):
        plain = [s[column] for s in steps[Arm.PLAIN]]
        with_callback = [s[column] for s in steps[Arm.CALLBACK]]
        ratios = [c / p for p, c in zip(windows(plain, args.every), windows(with_callback, args.every))]
        plain, with_callback = timed(plain, args.every), timed(with_callback, args.every)
        print(f"  {clock:4s} per step: plain {statistics.mean(plain) * 1e3:.2f} ms, with the callback "
              f"{statistics.mean(with_callback) * 1e3:.2f} ms (means); ratio "
              f"{statistics.median(ratios):.3f}x (median of {len(ratios)} windows of {args.every} steps, "
              f"{min(ratios):.3f} to {max(ratios):.3f}); totals {sum(with_callback) / sum(plain):.3f}x")


if __name__ == "__main__":
    main()
