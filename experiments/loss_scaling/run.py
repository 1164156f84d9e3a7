"""Loss scaling and gradient underflow: none, static 128 and dynamic, side by side.

    python experiments/loss_scaling/run.py [--config config.json] [--output DIR] [--steps N]

Trains the same fp16 ResNet three times (same seed: same initial weights and
batches), differing only in the loss scale, with per-layer gradient telemetry
against an fp32 shadow (`convprobe.training.run_comparison`). Each run streams
its records (header.json with provenance, steps.csv, telemetry.csv) to
DIR/<scale>/ and can be resumed by running the script again.

Writes to DIR (default: experiments/loss_scaling/results/): the three run
directories, comparison.csv and comparison.txt (per layer, kind and scale: mean
fractions flushed / subnormal / routing zeros / lost), the harness's figures
(underflow_per_layer.png, gradient_histogram.png, scale_trajectory.png) and
underflow.json: for each scale, whether `assert_no_gradient_underflow` holds for
the activation gradients, and its message when it does not. Notebook 03 reads
this directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from convprobe import experiment

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = experiment.parser(__doc__, HERE)
    parser.add_argument("--steps", type=int, help="override the config's steps (a shorter run)")
    args = parser.parse_args(argv)
    config, output = experiment.load(args, steps=args.steps)

    from convprobe import provenance
    from convprobe.testing import assert_no_gradient_underflow
    from convprobe.training import run_comparison, validate_config

    train_config = validate_config(
        dtype=config["dtype"], steps=config["steps"], record_every=config["record_every"],
        batch_size=config["batch_size"], resnet_size=config["resnet_size"], image_size=config["image_size"],
        seed=config["seed"], data=config["data"], jit=config["jit"], checkpoint_every=config["checkpoint_every"],
        progress=sys.stderr.isatty(),
    )
    runs, table = run_comparison(train_config, output, static_scale=float(config["static_scale"]), figures=True)
    verdicts = {}
    for label in runs:
        try:
            assert_no_gradient_underflow(output / label, kind="activation", tolerance=0.0)
            verdicts[label] = {"holds": True, "message": ""}
        except AssertionError as failure:
            verdicts[label] = {"holds": False, "message": str(failure)}
        print(f"{label}: {'no activation gradient flushed to zero' if verdicts[label]['holds'] else 'underflow'}")
    document = {"provenance": provenance.collect(seed=config["seed"]), "config": config, "underflow": verdicts}
    (output / "underflow.json").write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    print((output / "comparison.txt").read_text(encoding="utf-8"))
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
