"""`convprobe.configure(NAME)`: a configuration of `--list-configs` chosen from Python, before
TensorFlow starts, and honoured by TensorFlow's own kernel (the 65519 test)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import convprobe
from convprobe.errors import InvalidArgument

# The 65519 test through TensorFlow's conv2d: 0 with a wide accumulator, inf with an fp16 one.
CHILD = r"""
import json, sys
import convprobe
switches = convprobe.configure(sys.argv[1])
import numpy as np, tensorflow as tf
x = tf.constant(np.full((1, 1, 4, 1), 65519, np.float16))
w = tf.constant(np.array([65519, -65519], np.float16).reshape(1, 2, 1, 1))
y = tf.nn.conv2d(x, w, strides=1, padding="VALID").numpy().ravel().tolist()
try:
    convprobe.configure("default")
    late = None
except convprobe.InvalidArgument as error:
    late = str(error)
print("RESULT" + json.dumps({"switches": switches, "output": [str(v) for v in y], "late": late}))
"""


@pytest.mark.tensorflow
@pytest.mark.parametrize("name, output", [("onednn-off+fp16-acc", "inf"), ("onednn-off", "0.0")])
def test_a_configuration_chosen_from_python_is_the_one_tensorflow_runs(name, output):
    proc = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3",
                               "TF_CONV2D_USE_FP16_ACCUMULATE": "0"})  # an inherited switch is replaced
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["output"] == [output] * 3, result
    assert result["switches"]["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert result["late"] == ("configuration default must be set before TensorFlow starts; this process already "
                              "imported it: set it first thing, or run in a fresh process")


def test_an_unknown_configuration_names_the_rows():
    with pytest.raises(InvalidArgument) as info:
        convprobe.configure("onednn")
    assert str(info.value).startswith("configuration must be one of default, onednn-off, onednn-off+fp16-acc, ")
    assert str(info.value).endswith("; received 'onednn'")
