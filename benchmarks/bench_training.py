"""Throughput of the training step: fp32, fp16, fp16 + telemetry (every step, every 10).

    python benchmarks/bench_training.py [--batch-size 128] [--resnet-size 20] [--steps 60] [--no-jit]

Prints images/second and the ratios the issue sets goals for: fp16 >= 0.25 x fp32 on
the CPU, telemetry every 10 steps <= 15 % over the plain fp16 step. Synthetic data,
one process, XLA flags as the harness sets them (printed at the end).

Plain fp16 steps and "every 10 steps" blocks (one telemetry step, nine plain) are
timed in alternating blocks of ten, and each side is total images / total time:
shared machines drift by more than the effect measured (a plain-then-mixed order gave
-6 % once), and alternating blocks expose both sides to the same drift.
"""

from __future__ import annotations

import argparse
import json
import time

BLOCK = 10


def timed(trainer, step: int, telemetry: bool) -> float:
    start = time.perf_counter()
    trainer.step(step, telemetry=telemetry)
    return time.perf_counter() - start


def warm_up(trainer, telemetry: bool) -> None:
    """Compile (or load) every step function the measurement uses."""
    for k in range(2):
        trainer.step(k, telemetry=False)
        if telemetry:
            trainer.step(k, telemetry=True)


def plain_rate(trainer, steps: int) -> float:
    """Images/second over `steps` plain steps (total images / total time)."""
    warm_up(trainer, telemetry=False)
    seconds = sum(timed(trainer, 2 + k, False) for k in range(steps))
    return steps * trainer.config.batch_size / seconds


def telemetry_rates(trainer, steps: int) -> dict[str, float]:
    """Images/second of plain fp16 steps and of "telemetry every 10 steps" blocks, timed
    in alternating blocks, then of steps that all record telemetry."""
    warm_up(trainer, telemetry=True)
    batch = trainer.config.batch_size
    plain = mixed = 0.0
    step = 2
    rounds = max(steps // BLOCK, 1)
    for _ in range(rounds):
        for _ in range(BLOCK):
            plain += timed(trainer, step, False)
            step += 1
        for k in range(BLOCK):
            mixed += timed(trainer, step, k == 0)
            step += 1
    every_steps = max(steps // 3, 5)
    every = sum(timed(trainer, step + k, True) for k in range(every_steps))
    return {"fp16 step": rounds * BLOCK * batch / plain,
            "fp16 + telemetry every step": every_steps * batch / every,
            "fp16 + telemetry every 10 steps": rounds * BLOCK * batch / mixed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--resnet-size", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60,
                        help="timed steps per side of each measurement (default 60)")
    parser.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    from convprobe.training import runtime
    from convprobe.training.config import validate_config
    from convprobe.training.trainer import Trainer

    runtime.tensorflow()
    common = dict(batch_size=args.batch_size, resnet_size=args.resnet_size, image_size=args.image_size,
                  jit=args.jit, steps=4 * args.steps + 10, record_every=1)
    results = {}
    print(f"ResNet-{args.resnet_size}, batch {args.batch_size}, {args.image_size}x{args.image_size}, "
          f"jit={args.jit}, {args.steps} timed steps", flush=True)

    def record(name, value):
        results[name] = value
        print(f"  {name:<34} {value:10.1f} images/s", flush=True)

    fp32 = Trainer(validate_config(dtype="fp32", **common))
    record("fp32 step", plain_rate(fp32, args.steps))
    del fp32
    fp16 = Trainer(validate_config(dtype="fp16", loss_scale="dynamic", **common))
    for name, value in telemetry_rates(fp16, args.steps).items():
        record(name, value)
    fp16 = results["fp16 step"]
    print(f"  fp16 / fp32                        {fp16 / results['fp32 step']:10.3f}   (goal >= 0.25)")
    print(f"  telemetry every step: overhead     {fp16 / results['fp16 + telemetry every step'] - 1:10.1%}")
    print(f"  telemetry every 10 steps: overhead {fp16 / results['fp16 + telemetry every 10 steps'] - 1:10.1%}"
          "   (goal <= 15%)")
    facts = runtime.runtime_facts()
    print("  runtime: " + json.dumps({k: facts[k] for k in ("xla_flags", "xla_rounds_fp16_between_ops")}))


if __name__ == "__main__":
    main()
