"""Throughput of the training step: fp32, fp16, fp16 + telemetry (every step, every 10).

    python benchmarks/bench_training.py [--batch-size 128] [--resnet-size 20] [--steps 20] [--no-jit]

Prints images/second (median over timed steps after compilation) and the
ratios the issue sets goals for: fp16 >= 0.25 x fp32 on the CPU, telemetry
every 10 steps <= 15 % over the plain fp16 step. Synthetic data, one process,
XLA flags as the harness sets them (recorded in the printed provenance line).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def measure(trainer, steps: int, telemetry_every: int | None) -> float:
    """Images/second over `steps` steps (after one warm-up call of each compiled step)."""
    trainer.step(0, telemetry=False)
    if telemetry_every:
        trainer.step(1, telemetry=True)
    images = 0
    seconds = 0.0
    per_step = []
    for k in range(steps):
        telemetry = bool(telemetry_every) and k % telemetry_every == 0
        start = time.perf_counter()
        trainer.step(2 + k, telemetry=telemetry)
        dt = time.perf_counter() - start
        seconds += dt
        images += trainer.config.batch_size
        per_step.append(trainer.config.batch_size / dt)
    if telemetry_every in (None, 1):
        return statistics.median(per_step)
    return images / seconds  # a mix of plain and telemetry steps: total images / total time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--resnet-size", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement (default 20)")
    parser.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    from convprobe.training import runtime
    from convprobe.training.config import validate_config
    from convprobe.training.trainer import Trainer

    runtime.tensorflow()
    common = dict(batch_size=args.batch_size, resnet_size=args.resnet_size, image_size=args.image_size,
                  jit=args.jit, steps=args.steps + 2, record_every=1)
    results = {}
    print(f"ResNet-{args.resnet_size}, batch {args.batch_size}, {args.image_size}x{args.image_size}, "
          f"jit={args.jit}, {args.steps} timed steps", flush=True)

    def record(name, value):
        results[name] = value
        print(f"  {name:<34} {value:10.1f} images/s", flush=True)

    fp32 = Trainer(validate_config(dtype="fp32", **common))
    record("fp32 step", measure(fp32, args.steps, None))
    del fp32
    fp16 = Trainer(validate_config(dtype="fp16", loss_scale="dynamic", **common))
    record("fp16 step", measure(fp16, args.steps, None))
    record("fp16 + telemetry every step", measure(fp16, args.steps, 1))
    record("fp16 + telemetry every 10 steps", measure(fp16, max(args.steps, 10) // 10 * 10, 10))
    fp16 = results["fp16 step"]
    print(f"  fp16 / fp32                        {fp16 / results['fp32 step']:10.3f}   (goal >= 0.25)")
    print(f"  telemetry every step: overhead     {fp16 / results['fp16 + telemetry every step'] - 1:10.1%}")
    print(f"  telemetry every 10 steps: overhead {fp16 / results['fp16 + telemetry every 10 steps'] - 1:10.1%}"
          "   (goal <= 15%)")
    facts = runtime.runtime_facts()
    print("  runtime: " + json.dumps({k: facts[k] for k in ("xla_flags", "xla_rounds_fp16_between_ops")}))


if __name__ == "__main__":
    main()
