"""The harness under tf.distribute.MirroredStrategy on two logical CPU devices.

Logical devices must be configured before TensorFlow initialises its devices,
so this runs in a fresh interpreter.
"""

from __future__ import annotations

import json

import pytest

# One minute (XLA compiles the replica steps); tests/training/test_multi_worker.py runs
# MirroredStrategy by default.
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]

CHILD = r'''
import csv, json
from convprobe.training.config import validate_config
from convprobe.training.run_loop import train
config = validate_config(dtype="fp16", loss_scale="dynamic", steps=1, record_every=1, batch_size=8,
                         resnet_size=8, image_size=8, jit=True, distribute="mirrored",
                         logical_devices=2, output="run")
result = train(config)
header = json.load(open("run/header.json"))
rows = list(csv.DictReader(open("run/telemetry.csv")))
steps = list(csv.DictReader(open("run/steps.csv")))
print("RESULT" + json.dumps({"header": header, "rows": rows, "steps": steps, "jit": result.jit}))
'''


def test_mirrored_two_logical_cpus(tmp_path, run_python):
    proc = run_python(CHILD, tmp_path)
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    prov = out["header"]["provenance"]
    assert "2 replicas" in prov["device"]
    assert prov["runtime"]["logical_devices"] == 2
    assert out["jit"] is True and prov["runtime"]["jit_effective"] is True  # XLA per replica
    assert "each replica's forward and backward pass" in prov["runtime"]["jit_scope"]
    assert len(out["steps"]) == 1 and all(float(s["loss"]) > 0 for s in out["steps"])
    assert all(s["finite"] == "True" for s in out["steps"])
    # Telemetry is summed over replicas: the first conv's activation gradient covers
    # the global batch (8 x 8 x 8 x 16), not one replica's half of it.
    first = [r for r in out["rows"] if r["step"] == "0" and r["layer"] == "initial_conv"
             and r["kind"] == "activation"]
    assert [int(r["n"]) for r in first] == [8 * 8 * 8 * 16]
    assert int(first[0]["routing_zero"]) + int(first[0]["subnormal"]) <= int(first[0]["n"])
