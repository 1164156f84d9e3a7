"""Error versus reduction length K, per configuration and emulator model, against the bounds.

    python experiments/error_vs_k/run.py [--config config.json] [--output DIR]

Runs `convprobe sweep` (as a user would type it: every TensorFlow configuration
in its own fresh process, the emulator models in process) over the K values and
input distributions of the config, then draws the error of every configuration
and model next to the deterministic gamma_K and probabilistic lambda sqrt(K) u
bounds for fp16 and fp32 accumulation (`analysis.figures.error_vs_k_figure`).

Writes to DIR (default: experiments/error_vs_k/results/): sweep.csv (the tidy
sweep table, provenance in every row; notebook 02 reads it),
error_vs_k_tensorflow.png and error_vs_k_emulated.png (one figure per backend, so
that identical lines do not hide each other), and exceeds.csv (the rows whose error exceeds the probabilistic bound).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from convprobe import experiment

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    args = experiment.parser(__doc__, HERE).parse_args(argv)
    config, output = experiment.load(args)

    command = [
        sys.executable, "-m", "convprobe", "sweep",
        "--configs", ",".join(config["configurations"]) or "none", "--device", config["device"],
        "--op", config["ops"], "--ks", ",".join(str(k) for k in config["ks"]),
        "--distributions", config["distributions"], "--rows", str(config["rows"]),
        "--seed", str(config["seed"]), "--bound-format", config["bound_format"],
        "--timeout", str(config["timeout_s"]), "--output", str(output / "sweep.csv"),
    ]
    for model in config["models"]:
        command += ["--model", model]
    print("$", " ".join(command[1:]))
    subprocess.run(command, check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})

    from convprobe.analysis import figures, tables

    frame = tables.add_bounds(tables.read_table(output / "sweep.csv", "sweep"), config["bound_format"], output="fp16")
    # One figure per backend: a TensorFlow configuration that computes exactly like an emulator
    # model draws the same line, and would hide under it in a shared figure.
    for backend, part in frame.groupby("backend"):
        figures.error_vs_k_figure(part, accumulators=("fp16", "fp32"), output="fp16",
                                  title=f"Worst error over seeds versus K: {backend}") \
            .savefig(output / f"error_vs_k_{backend}.png", dpi=110)
    exceeds = frame[frame["exceeds_probabilistic"] == True]  # noqa: E712 - nullable boolean column
    exceeds.to_csv(output / "exceeds.csv", index=False)
    print(f"{len(frame)} rows, {len(exceeds)} above the probabilistic bound; results in {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
