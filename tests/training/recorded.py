"""A recorded run directory, written without TensorFlow, for the tests of what a resume or a
second run may do to it."""

import csv
import json

import numpy as np

from convprobe import results
from convprobe.training.config import validate_config
from convprobe.training.records import STEP_COLUMNS, TELEMETRY_COLUMNS


def recorded_config(output, steps=6):
    """The configuration of `recorded_run`'s run, extended to `steps`."""
    return validate_config(batch_size=8, resnet_size=8, image_size=8, record_every=1,
                           checkpoint_every=2, steps=steps, output=str(output), progress=False)


#: The command-line options that give `recorded_config`'s run (with --steps and --output).
RECORDED_ARGS = ["--batch-size", "8", "--resnet-size", "8", "--image-size", "8", "--record-every", "1",
                 "--checkpoint-every", "2"]


def recorded_run(tmp_path):
    """A run directory as a 4-step run leaves it (header, 4 step rows, telemetry, checkpoint),
    written without TensorFlow."""
    out = tmp_path / "rep"
    out.mkdir()
    header = results.envelope("train", recorded_config(out, steps=4).to_json(), {"seed": 0}, resumed_at_steps=[],
                              columns={"steps": list(STEP_COLUMNS), "telemetry": list(TELEMETRY_COLUMNS)},
                              layers={"weight": ["w"], "activation": ["a"]}, histogram_bins=[-40, 0])
    (out / "header.json").write_text(json.dumps(header))
    with (out / "steps.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(STEP_COLUMNS)
        for step in range(4):
            writer.writerow([step, 2.3, 0.1, 128, True, False, True, 0.1, 80.0, "", ""])
    with (out / "telemetry.csv").open("w", newline="") as handle:
        csv.writer(handle).writerow(TELEMETRY_COLUMNS)
    np.savez(out / "checkpoint.npz", w0=np.zeros(3), o0=np.zeros(1), next_step=np.array(4),
             counters=np.array(json.dumps({"skipped": 0, "nonfinite": 0})))
    return out
