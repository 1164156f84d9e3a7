"""XLA keeps fp16 rounding, and telemetry under jit agrees with telemetry without.

Runs in a fresh interpreter so the harness sets XLA_FLAGS before TensorFlow
starts (XLA reads them once).
"""

from __future__ import annotations

import json

import pytest

from convprobe.training.telemetry import COUNT_FIELDS

pytestmark = pytest.mark.tensorflow

CHILD = r'''
import json, os
os.environ.pop("XLA_FLAGS", None)          # the harness must set its own flags
from convprobe.training import runtime
from convprobe.training.config import validate_config
from convprobe.training.trainer import Trainer
out = {}
for jit in (False, True):
    config = validate_config(dtype="fp16", loss_scale=str(2.0 ** -10), steps=1, record_every=1,
                             batch_size=4, resnet_size=8, image_size=8, jit=jit)
    trainer = Trainer(config, eager=not jit)  # eager: the same kernels as a graph without XLA
    result = trainer.step(0, telemetry=True)
    out[str(jit)] = {"counts": result["counts"].tolist(), "loss": result["loss"], "jit": trainer.jit}
out["rounds"] = runtime.xla_rounds_fp16()
out["facts"] = runtime.runtime_facts()
print("RESULT" + json.dumps(out))
'''


@pytest.mark.slow  # about 40 s: XLA compiles the whole training step
def test_jit_keeps_fp16_rounding_and_telemetry_agrees(tmp_path, run_python):
    proc = run_python(CHILD, tmp_path)
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert out["facts"]["xla_flag_set_before_tensorflow_import"] is True
    assert out["rounds"] is True, "jit-compiled fp16 arithmetic did not round between ops"
    assert out["True"]["jit"] is True and out["False"]["jit"] is False
    plain, jit = out["False"]["counts"], out["True"]["counts"]
    f = {name: i for i, name in enumerate(COUNT_FIELDS)}
    flushed_somewhere = 0
    for a, b in zip(plain, jit):
        # Structure and the fp32 shadow do not depend on XLA: exactly equal.
        for name in ("n", "routing_zero", "shadow_underflow", "shadow_subnormal", "inf", "nan"):
            assert a[f[name]] == b[f[name]], name
        # The fp16 values may differ in accumulation order inside the (fp32-accumulated)
        # convolutions. An element can land in different classes in the two runs only if
        # at least one run disagrees with the shadow's class for it, so each count differs
        # by at most the sum of the two runs' class-mismatch counts.
        bound = a[f["class_mismatch"]] + b[f["class_mismatch"]]
        for name in ("flushed", "lost", "subnormal"):
            assert abs(a[f[name]] - b[f[name]]) <= bound, (name, a, b)
        flushed_somewhere += a[f["flushed"]]
    assert flushed_somewhere > 0  # the comparison is not vacuous: this setting does flush
