"""Accuracy parity: fp32, fp16 + dynamic loss scaling, fp16 without scaling.

    python experiments/accuracy_parity/run.py [--config config.json] [--output DIR]
        [--steps N] [--seeds 0,1,2] [--resnet-size 8] [--batch-size 32] [--image-size 16]
        [--noise 8] [--eval-batches 8]

Trains every setting of the config for every seed (each run resumable, records
under DIR/<setting>/seed<k>/ as the harness writes them), then writes
DIR/results.json (provenance, config, per-run and per-setting final evaluation
accuracy mean +- sample std) and DIR/results.csv. Command-line values override
the config (for a smaller run). Not run in CI.

The reference ResNet's fp16 PR (tensorflow/models #3687) reported ImageNet
top-1 75.87 % in fp16 against 75.75 % +- 0.28 % (3 runs) in fp32.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

from convprobe import experiment

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = experiment.parser(__doc__, HERE)
    parser.add_argument("--steps", type=int, help="training steps per run (overrides the config)")
    parser.add_argument("--seeds", help="comma-separated seeds (overrides the config)")
    parser.add_argument("--resnet-size", type=int, help="depth 6n+2 (overrides the config)")
    parser.add_argument("--batch-size", type=int, help="global batch size (overrides the config)")
    parser.add_argument("--image-size", type=int, help="synthetic image side (overrides the config)")
    parser.add_argument("--noise", type=float, help="synthetic noise standard deviation (overrides the config)")
    parser.add_argument("--eval-batches", type=int, help="evaluation batches after training (overrides the config)")
    parser.add_argument("--settings", help="comma-separated subset of the config's setting names")
    args = parser.parse_args(argv)

    config, output = experiment.load(
        args, steps=args.steps, resnet_size=args.resnet_size, batch_size=args.batch_size,
        image_size=args.image_size, synthetic_noise=args.noise, eval_batches=args.eval_batches)
    if args.seeds:
        config["seeds"] = [int(s) for s in args.seeds.split(",")]
    if args.settings:
        wanted = args.settings.split(",")
        config["settings"] = [s for s in config["settings"] if s["name"] in wanted]

    from convprobe import provenance
    from convprobe.training import runtime
    from convprobe.training.config import validate_config
    from convprobe.training.trainer import train

    runtime.tensorflow()
    runs = []
    for setting in config["settings"]:
        for seed in config["seeds"]:
            run_config = validate_config(
                dtype=setting["dtype"], loss_scale=setting["loss_scale"], steps=config["steps"],
                record_every=config["record_every"], batch_size=config["batch_size"],
                resnet_size=config["resnet_size"], image_size=config["image_size"], seed=seed,
                data=config["data"], data_dir=config["data_dir"], jit=config["jit"],
                learning_rate=config["learning_rate"], checkpoint_every=config["checkpoint_every"],
                eval_batches=config["eval_batches"], synthetic_noise=config["synthetic_noise"],
                bn_momentum=config.get("bn_momentum", 0.997),
                output=str(output / setting["name"] / f"seed{seed}"), progress=sys.stderr.isatty(),
            )
            result = train(run_config)
            runs.append({"setting": setting["name"], "seed": seed, "eval_accuracy": result.eval_accuracy,
                         "final_loss": result.final_loss, "skipped_steps": result.skipped_steps,
                         "nonfinite_steps": result.nonfinite_steps,
                         "final_loss_scale": result.final_loss_scale,
                         "images_per_second": result.images_per_second})
            print(f"{setting['name']:>14} seed {seed}: eval accuracy {result.eval_accuracy:.4f}, "
                  f"final loss {result.final_loss:.4f}, skipped {result.skipped_steps}", flush=True)

    summary = {}
    for setting in config["settings"]:
        acc = [r["eval_accuracy"] for r in runs if r["setting"] == setting["name"]]
        summary[setting["name"]] = {
            "runs": len(acc),
            "mean": statistics.fmean(acc),
            "std": statistics.stdev(acc) if len(acc) > 1 else None,
        }
    results = {
        "provenance": provenance.collect(seed=None, device="cpu", extra={"runtime": runtime.runtime_facts()}),
        "config": config,
        "runs": runs,
        "summary": summary,
    }
    (output / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    with (output / "results.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    for name, s in summary.items():
        std = f" +- {100 * s['std']:.2f}" if s["std"] is not None else ""
        print(f"{name:>14}: {100 * s['mean']:.2f}%{std} (n={s['runs']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
