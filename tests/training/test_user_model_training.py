"""`convprobe train --keras-model M.keras --data D.npz`: a user's own saved, compiled model
trained as the ResNet is: records a report reads, telemetry of every weight and layer
output, a resumed run that ends bit for bit where an uninterrupted one ends, the twin bit for
bit through the command line, arms; and bad models or data refused in one line before any
step."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from convprobe.training.config import validate_config
from convprobe.training.records import read_header, read_summary
from conftest import main_in_process, run_cli

pytestmark = pytest.mark.tensorflow


def _save(tmp_path, *, compiled: bool = True, batch: int | None = 4):
    """A small functional model under mixed_float16 (Conv2D with a bias, DepthwiseConv2D,
    Dense, a float32 softmax), and seeded data for it."""
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = keras.Input((6, 6, 2), batch_size=batch)
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
        x = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
        x = keras.layers.Dense(3, name="dense")(keras.layers.GlobalAveragePooling2D(name="pool")(x))
        model = keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32", name="softmax")(x))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if compiled:
        model.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.5), loss="sparse_categorical_crossentropy")
    model.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x_train=rng.uniform(-1, 1, (24, 6, 6, 2)).astype(np.float32),
             y_train=rng.integers(0, 3, 24), x_test=rng.uniform(-1, 1, (8, 6, 6, 2)).astype(np.float32),
             y_test=rng.integers(0, 3, 8))


def _steps(directory) -> list[dict]:
    with open(directory / "steps.csv", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras' own save path, not ours
def test_a_users_model_trains_with_records_telemetry_and_a_resume_that_ends_bit_for_bit(tmp_path):
    from convprobe.training.run_loop import train

    _save(tmp_path)

    def config(name):
        return validate_config(keras_model=str(tmp_path / "m.keras"), data=str(tmp_path / "d.npz"), steps=6,
                               batch_size=4, record_every=2, checkpoint_every=2, loss_scale="dynamic", jit=False,
                               eval_batches=2, output=str(tmp_path / name))

    whole = train(config("whole"))
    assert whole.final_step == 6 and whole.eval_accuracy is not None
    header = read_header(tmp_path / "whole")
    assert header["params"]["keras_model"] == str((tmp_path / "m.keras").resolve())
    assert header["params"]["resnet_size"] is None and header["params"]["learning_rate"] is None
    record = header["arithmetic"]
    assert [layer["layer"] for layer in record["layers"]] == ["conv", "depthwise", "dense"]
    assert record["policy"].startswith("the model's own policy, mixed_float16")
    assert header["layers"]["activation"] == ["conv", "depthwise", "pool", "dense", "softmax"]
    steps = _steps(tmp_path / "whole")
    assert [row["step"] for row in steps] == [str(k) for k in range(6)]
    assert steps[0]["loss"] != steps[-1]["loss"]  # it trains
    with open(tmp_path / "whole" / "telemetry.csv", newline="") as handle:
        measured = {(row["step"], row["layer"]) for row in csv.DictReader(handle)}
    assert ("2", "conv/kernel") in measured and ("2", "softmax") in measured and ("1", "conv/kernel") not in measured
    # interrupted after 3 steps (its checkpoint at step 2), then the same command again
    train(config("resumed"), stop_after=3)
    resumed = train(config("resumed"))
    assert resumed.steps_run == 4 and resumed.final_step == 6
    assert read_summary(tmp_path / "resumed")["weights_sha256"] == read_summary(tmp_path / "whole")["weights_sha256"]
    assert [row["loss"] for row in _steps(tmp_path / "resumed")] == [row["loss"] for row in steps]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_bad_models_and_data_are_one_line_and_exit_2_before_any_step(tmp_path):
    _save(tmp_path)
    (tmp_path / "raw").mkdir()
    _save(tmp_path / "raw", compiled=False)
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "wide.npz", x_train=rng.uniform(size=(8, 6, 6, 3)), y_train=rng.integers(0, 3, 8))
    np.savez(tmp_path / "labels.npz", x_train=rng.uniform(size=(8, 6, 6, 2)), y_train=rng.integers(0, 3, (8, 5)))
    np.savez(tmp_path / "short.npz", x_train=rng.uniform(size=(8, 6, 6, 2)), y_train=rng.integers(0, 3, 7))
    np.savez(tmp_path / "no_test.npz", x_train=rng.uniform(size=(8, 6, 6, 2)), y_train=rng.integers(0, 3, 8))
    model, data = str(tmp_path / "m.keras"), str(tmp_path / "d.npz")
    cases = [
        (["--keras-model", str(tmp_path / "raw" / "m.keras"), "--data", data], "is not compiled: train reads its loss"),
        (["--keras-model", model, "--data", str(tmp_path / "wide.npz")],
         "x_train's samples are (6, 6, 3) and the model takes (6, 6, 2)"),
        (["--keras-model", model, "--data", str(tmp_path / "labels.npz")], "y_train does not fit the model's loss"),
        (["--keras-model", model, "--data", str(tmp_path / "short.npz")],
         "x_train and y_train must hold as many samples; received 8 and 7"),
        (["--keras-model", model, "--data", data, "--batch-size", "8"],
         "--batch-size must be the batch the model's input fixes (4); received 8"),
        (["--keras-model", model, "--data", data, "--resnet-size", "20"], "--resnet-size applies to the ResNet"),
        (["--keras-model", model], "--keras-model trains on your data: give --data D.npz"),
        (["--keras-model", model, "--data", str(tmp_path / "no_test.npz"), "--eval-batches", "2"],
         "--eval-batches 2 reads x_test and y_test, which --data does not hold"),
        (["--data", data], "--data " + data + " is a user's data file: it trains a user's model"),
    ]
    for index, (args, message) in enumerate(cases):
        argv = ["train", *args, "--steps", "2", "--no-jit", "--output", str(tmp_path / "run")]
        if index == 0:  # one case as a user runs it, in a fresh process; the rest in this one (faster)
            proc = run_cli(*argv)
            code, err = proc.returncode, proc.stderr
        else:
            code, _, err = main_in_process(argv)
        lines = [line for line in err.splitlines() if line.startswith("convprobe")]
        assert code == 2 and len(lines) == 1 and message in lines[0], (args, err[-2000:])
        assert "Traceback" not in err and not (tmp_path / "run").exists(), args


@pytest.mark.slow  # identify, then two runs and four arms in their own processes: about a minute and a half
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_command_lines_twin_is_native_bit_for_bit_and_arms_of_a_users_model_are_reported(tmp_path):
    _save(tmp_path)
    common = ["train", "--keras-model", str(tmp_path / "m.keras"), "--data", str(tmp_path / "d.npz"),
              "--config", "onednn-off+fp16-acc", "--no-jit", "--steps", "4", "--record-every", "1"]
    for name, extra in (("native", []), ("twin", ["--arithmetic", "twin"])):
        proc = run_cli(*common, *extra, "--output", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert [row["loss"] for row in _steps(tmp_path / "twin")] == [row["loss"] for row in _steps(tmp_path / "native")]
    assert read_summary(tmp_path / "twin")["weights_sha256"] == read_summary(tmp_path / "native")["weights_sha256"]
    assert (tmp_path / "twin" / "identify.json").is_file()
    proc = run_cli("train", "--keras-model", str(tmp_path / "m.keras"), "--data", str(tmp_path / "d.npz"),
                   "--arm", "fp16/dynamic", "--arm", "fp16/dynamic@v100:out=fp16", "--seeds", "0,1", "--steps", "6",
                   "--eval-batches", "2", "--output", str(tmp_path / "arms"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads((tmp_path / "arms" / "comparison.json").read_text())
    assert [row["status"] for row in document["runs"]] == ["ok"] * 4
    native, v100 = (read_summary(tmp_path / "arms" / name)["weights_sha256"]
                    for name in ("fp16-dynamic_seed0", "fp16-dynamic--v100-out-fp16_seed0"))
    assert native != v100, "fp16 accumulation on a V100 changed nothing"
    proc = run_cli("report", str(tmp_path / "arms"), "--out-dir", str(tmp_path / "figures"))
    assert proc.returncode == 0 and (tmp_path / "figures" / "arms-accuracy.png").is_file(), proc.stderr
