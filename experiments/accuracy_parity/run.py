"""Accuracy parity: does fp16 training reach fp32's accuracy? A thin wrapper over the CLI.

    python experiments/accuracy_parity/run.py [--config config.json] [--output DIR]
        [--steps N] [--seeds 0,1,2] [--arms fp32,fp16/dynamic] [--resnet-size 8]
        [--batch-size 32] [--eval-batches 8]

Runs exactly ``convprobe train --arm ARM ... --seeds S,... --output DIR`` with the config's
settings (printed first): every arm at every seed, each run its own process, records under
DIR/<arm>_seed<k>/, and DIR/comparison.json (a train-comparison envelope: per run the final
evaluation accuracy, final loss, skipped steps and underflow; per arm mean and sample std)
with DIR/comparison.txt. ``convprobe report DIR`` draws it. Rerunning resumes and reuses
finished runs. Command-line values override the config. Not run in CI.

The reference ResNet's fp16 PR (tensorflow/models #3687) reported ImageNet top-1 75.87 %
in fp16 against 75.75 % +- 0.28 % (3 runs) in fp32.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from convprobe import cli, experiment

HERE = Path(__file__).resolve().parent

#: config key -> `convprobe train` option (null values are left out).
OPTIONS = {"data": "--data", "data_dir": "--data-dir", "resnet_size": "--resnet-size", "batch_size": "--batch-size",
           "steps": "--steps", "learning_rate": "--learning-rate", "bn_momentum": "--bn-momentum",
           "record_every": "--record-every", "checkpoint_every": "--checkpoint-every",
           "eval_batches": "--eval-batches"}


def command(config: dict, output: Path) -> list[str]:
    """The `convprobe train` arguments the config stands for."""
    argv = ["train"]
    for arm in config["arms"]:
        argv += ["--arm", arm]
    argv += ["--seeds", ",".join(str(seed) for seed in config["seeds"])]
    for key, option in OPTIONS.items():
        if config.get(key) is not None:
            argv += [option, str(config[key])]
    return argv + ["--output", str(output)]


def main(argv=None) -> int:
    parser = experiment.parser(__doc__, HERE)
    parser.add_argument("--steps", type=int, help="training steps per run (overrides the config)")
    parser.add_argument("--seeds", help="comma-separated seeds (overrides the config)")
    parser.add_argument("--arms", help="comma-separated arms (overrides the config)")
    parser.add_argument("--resnet-size", type=int, help="depth 6n+2 (overrides the config)")
    parser.add_argument("--batch-size", type=int, help="global batch size (overrides the config)")
    parser.add_argument("--eval-batches", type=int, help="evaluation batches after training (overrides the config)")
    args = parser.parse_args(argv)
    config, output = experiment.load(args, steps=args.steps, resnet_size=args.resnet_size,
                                     batch_size=args.batch_size, eval_batches=args.eval_batches)
    if args.seeds:
        config["seeds"] = [int(s) for s in args.seeds.split(",")]
    if args.arms:
        config["arms"] = args.arms.split(",")
    arguments = command(config, output)
    print("convprobe " + " ".join(shlex.quote(a) for a in arguments), flush=True)
    return cli.main(arguments)


if __name__ == "__main__":
    raise SystemExit(main())
