"""TensorFlow's start-up notices stay off stderr; everything else written there stays."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from convprobe.training import runtime


def test_only_the_start_up_notices_are_dropped(capfd):
    with runtime.start_up_notices_dropped():
        os.write(2, b"I0000 00:00:1796564769.895215    6574 cudart_stub.cc:31] Could not find cuda drivers on "
                    b"your machine, GPU will not be used.\n")
        os.write(2, b"E0000 00:00:1796564776.513865    6574 cuda_platform.cc:52] failed call to cuInit: x\n")
        os.write(2, b"E0000 00:00:1796564776.513865    6574 conv_ops.cc:52] a real error stays\n")
        os.write(2, b"Traceback (most recent call last): stays too\n")
    err = capfd.readouterr().err
    assert "cuda drivers" not in err and "cuInit" not in err
    assert "a real error stays" in err and "Traceback (most recent call last): stays too" in err


@pytest.mark.tensorflow
def test_starting_tensorflow_for_training_prints_no_notices():
    code = ("import sys\nfrom convprobe.training import runtime\ntf = runtime.tensorflow()\n"
            "tf.nn.conv2d(tf.ones([1, 4, 4, 2], tf.float16), tf.ones([3, 3, 2, 2], tf.float16), 1, 'SAME')\n"
            "print('kept', file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == "kept", proc.stderr


@pytest.mark.tensorflow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras' own save path, not ours
def test_identify_loading_a_users_model_prints_its_one_line_and_no_notices(tmp_path):
    """identify loads a Keras model in the parent process; a model with nothing to measure is
    refused in one line, with no TensorFlow start-up notice before it."""
    import keras

    inputs = keras.Input((4,))
    keras.Model(inputs, keras.layers.EinsumDense("ab,bc->ac", output_shape=2)(inputs)).save(tmp_path / "dense.keras")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "convprobe", "identify", "--keras-model", str(tmp_path / "dense.keras"),
                           "--configs", "default", "--output", str(tmp_path / "map.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no layer identify measures" in lines[0], proc.stderr
    assert not (tmp_path / "map.json").exists()
