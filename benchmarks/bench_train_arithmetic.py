"""Benchmark: a training step under an emulated arithmetic against the native fp32 step.

Run: ``python benchmarks/bench_train_arithmetic.py [--resnet-size 20] [--batch-size 32]
[--steps 5] [--arithmetic v100:out=fp16 a100 twin ...]``, or on your own model:
``python benchmarks/bench_train_arithmetic.py --keras-model M.keras --data D.npz`` (its
batch the one its input fixes unless --batch-size says; `scripts/example_model.py` writes
one with Conv2D, DepthwiseConv2D, SeparableConv2D, Conv2DTranspose and Dense layers).

The goal (issue 41): a step whose every conv, forward and both gradients, runs in the
emulator costs at most 25x the native fp32 step of the same model and batch. Each arm
runs in its own process (a configuration and XLA are chosen before TensorFlow starts),
builds the harness's `Trainer` on synthetic data (or `UserModelTrainer` on the user's), runs two warm-up steps, then times
`--steps` plain steps (no telemetry). It prints process CPU time per step (every thread
of the process) and its ratio to the floor, native fp32 with XLA as the harness runs it
by default, measured in this same run; wall time is printed beside it. The twin's
identify map is measured once, before the timing, by `convprobe identify`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: (label, dtype, arithmetic, jit): the floor first.
FLOOR = ("native fp32 (XLA)", "fp32", "native", True)
NATIVE = [("native fp32 (no XLA)", "fp32", "native", False), ("native fp16 (XLA)", "fp16", "native", True),
          ("native fp16 (no XLA)", "fp16", "native", False)]


def child(args) -> None:
    """Time one arm in this (fresh) process and print one JSON line."""
    from convprobe.training.arithmetic import read_identify_map
    from convprobe.training.config import validate_config
    from convprobe.training.trainer import Trainer
    from convprobe.training.user_trainer import UserModelTrainer

    model = (dict(keras_model=args.keras_model, data=args.data) if args.keras_model else
             dict(resnet_size=args.resnet_size))
    config = validate_config(dtype=args.dtype, arithmetic=args.child, jit=args.jit == "on",
                             batch_size=args.batch_size, steps=args.steps + 2, **model)
    kind = UserModelTrainer if args.keras_model else Trainer
    trainer = kind(config, identify_map=None if args.map is None else read_identify_map(args.map))
    for step in range(2):
        trainer.step(step, telemetry=False)
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(2, 2 + args.steps):
        trainer.step(step, telemetry=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    emulated = trainer.arithmetic_record()["emulated_ops"]
    print(json.dumps({"cpu": cpu / args.steps, "wall": wall / args.steps, "emulated_ops": emulated}))


def run_arm(args, dtype: str, arithmetic: str, jit: bool, identify_map: str | None) -> dict:
    command = [sys.executable, __file__, "--child", arithmetic, "--dtype", dtype, "--jit", "on" if jit else "off",
               "--batch-size", str(args.batch_size), "--steps", str(args.steps), *_model_arguments(args)]
    if identify_map is not None:
        command += ["--map", identify_map]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _model_arguments(args) -> list[str]:
    if args.keras_model:
        return ["--keras-model", args.keras_model, "--data", args.data]
    return ["--resnet-size", str(args.resnet_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resnet-size", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default 32; with --keras-model the batch its input fixes, if one")
    parser.add_argument("--keras-model", default=None, help="your saved, compiled model instead of the ResNet")
    parser.add_argument("--data", default=None, help="with --keras-model: its .npz (x_train, y_train)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--arithmetic", nargs="*", default=["v100:out=fp16", "a100", "sequential:fp32:output=fp16", "twin"])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="fp16", help=argparse.SUPPRESS)
    parser.add_argument("--jit", default="off", help=argparse.SUPPRESS)
    parser.add_argument("--map", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch_size is None:
        from convprobe.training.user_trainer import saved_batch_size

        args.batch_size = (saved_batch_size(args.keras_model) if args.keras_model else None) or 32
    if args.child is not None:
        return child(args)
    model = f"{args.keras_model} on {args.data}" if args.keras_model else f"ResNet-{args.resnet_size}, synthetic 32x32"
    print(f"{model}, batch {args.batch_size}, {args.steps} timed steps after 2 "
          f"warm-up steps, each arm in its own process; CPU = process CPU seconds per step (all threads)")
    with tempfile.TemporaryDirectory(prefix="bench-twin-") as scratch:
        identify_map = None
        if "twin" in args.arithmetic:
            identify_map = str(Path(scratch) / "identify.json")
            model = ["--keras-model", args.keras_model] if args.keras_model else ["--resnet-size", str(args.resnet_size)]
            subprocess.run([sys.executable, "-m", "convprobe", "identify", *model, "--batch", str(args.batch_size), "--configs", "default", "--timeout", "3600",
                            "--output", identify_map],
                           capture_output=True, check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        floor = run_arm(args, *FLOOR[1:], None)
        if "error" in floor:
            raise SystemExit(f"the floor ({FLOOR[0]}) failed: {floor['error']}")
        print(f"{'arm':34s} {'CPU s/step':>11s} {'wall s/step':>12s} {'emulated ops':>13s} {'x floor CPU':>12s}")
        rows = [(FLOOR[0], floor)] + [(label, run_arm(args, d, a, j, None)) for label, d, a, j in NATIVE]
        rows += [(f"fp16 @ {arm}", run_arm(args, "fp16", arm, False, identify_map if arm == "twin" else None))
                 for arm in args.arithmetic]
        for label, row in rows:
            if "error" in row:
                print(f"{label:34s} failed: {row['error']}")
                continue
            ratio = row["cpu"] / floor["cpu"]
            print(f"{label:34s} {row['cpu']:11.3f} {row['wall']:12.3f} {row['emulated_ops']:13d} {ratio:11.1f}x")


if __name__ == "__main__":
    main()
