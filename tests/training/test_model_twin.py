"""The twin of a user's own Keras model (not convprobe's ResNet): identify measures every layer
kind at the model's own shapes, and `use_arithmetic(model, "twin", arithmetic_map=...)`
reproduces `model.fit` bit for bit in the configuration this process runs, a bias that
TensorFlow adds inside its kernel included; a map with one wrong model does not."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from convprobe.errors import InvalidArgument
from conftest import REPO, run_cli_json

pytestmark = pytest.mark.tensorflow


def _save_model(path):
    """Conv2D with a bias and ReLU, DepthwiseConv2D, SeparableConv2D, Conv2DTranspose, Conv1D and
    Dense on a fixed batch of 4, under mixed_float16."""
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = keras.Input((6, 6, 3), batch_size=4)
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
        x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="depthwise")(x)
        x = keras.layers.SeparableConv2D(4, 3, padding="same", name="separable")(x)
        x = keras.layers.Conv2DTranspose(3, 3, strides=2, padding="same", name="transpose")(x)
        x = keras.layers.Conv1D(4, 3, padding="causal", name="one_d")(keras.layers.Reshape((48, 9))(x))
        x = keras.layers.Dense(5, name="dense")(keras.layers.GlobalAveragePooling1D()(x))
        outputs = keras.layers.Activation("softmax", dtype="float32")(x)
        keras.Model(inputs, outputs).save(path)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _fit(path, arithmetic=None, **kwargs):
    import keras

    from convprobe.training import use_arithmetic

    keras.utils.set_random_seed(0)
    model = keras.models.load_model(path, compile=False)
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5)),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-1, 1, (12, 6, 6, 3)).astype(np.float32), rng.integers(0, 5, 12)
    losses = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda _, logs: losses.append(logs["loss"]))
    fit = dict(batch_size=4, shuffle=False, verbose=0, callbacks=[record])
    if arithmetic is None:
        model.fit(x, y, **fit)
        return losses, model.get_weights(), None
    with use_arithmetic(model, arithmetic, **kwargs) as what_ran:
        model.fit(x, y, **fit)
    return losses, model.get_weights(), what_ran


def _equal(first, second) -> bool:
    return all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(first, second))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras' own save path, not ours
def test_the_twin_of_a_users_model_is_its_fit_bit_for_bit_and_a_wrong_map_is_not(tmp_path):
    from convprobe.training.runtime import configuration_in_effect

    _save_model(tmp_path / "m.keras")
    configuration = configuration_in_effect()
    run_cli_json("identify", "--keras-model", str(tmp_path / "m.keras"), "--configs", configuration,
                 "--output", str(tmp_path / "map.json"))
    native_losses, native, _ = _fit(tmp_path / "m.keras")
    losses, weights, record = _fit(tmp_path / "m.keras", "twin", arithmetic_map=tmp_path / "map.json")
    assert [r["layer"] for r in record["layers"]] == ["conv", "depthwise", "separable/depthwise",
                                                       "separable/pointwise", "transpose", "one_d", "dense"]
    assert record["not_computed"] == [] and record["configuration"] == configuration
    biased = {r["layer"]: r["bias"]["placement"] for r in record["layers"] if "bias" in r}
    assert set(biased) == {"conv", "depthwise", "separable/pointwise", "transpose", "one_d", "dense"}, biased
    assert "unreproduced" not in biased.values(), record["layers"]
    emulated = sum(cell["arithmetic"] != "tensorflow" for r in record["layers"] for cell in r["ops"].values())
    assert emulated >= 18, record["layers"]  # (every op the map has a model for; a twin of native ops proves nothing)
    assert losses == native_losses
    assert _equal(weights, native), "the twin's final weights differ from model.fit's"
    # one op's measured model replaced by another: the twin must now differ (it can fail)
    document = json.loads((tmp_path / "map.json").read_text())
    (label, cells), = document["matches"].items()
    cell = cells["dense / matmul_kernel_gradient"]["summary"]
    cell["best"], cell["perfect"] = "sequential:fp16", ["sequential:fp16"]
    _, wrong, _ = _fit(tmp_path / "m.keras", "twin", arithmetic_map=document)
    assert not _equal(wrong, native), "a wrong model for one op changed nothing"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_twin_refuses_a_map_of_other_shapes_or_configurations_in_one_line(tmp_path):
    import keras

    from convprobe.training import use_arithmetic

    _save_model(tmp_path / "m.keras")
    label = "tensorflow/cpu/onednn-off"  # a map of the first conv at batch 2 (the fields the twin reads)
    shape = {"input_shape": [2, 6, 6, 3], "filter_shape": [3, 3, 3, 4], "strides": [1, 1], "padding": "SAME",
             "dilation": [1, 1], "name": "conv", "kind": "conv2d"}
    document = {"results": [{"config": {"name": "onednn-off", "label": label}, "status": "ok",
                             "observed": {"layers": [{"layer": shape, "ops": {}}]}}],
                "matches": {label: {op: {"summary": {"best": "sequential:fp16", "perfect": ["sequential:fp16"]}}
                                    for op in ("conv2d", "conv2d_backprop_input", "conv2d_backprop_filter")}}}
    model = keras.models.load_model(tmp_path / "m.keras", compile=False)
    for kwargs, message in (
            ({"configuration": "fp16-acc"}, "the identify map has no results for configuration 'fp16-acc'; its "
                                            "configurations are onednn-off"),
            ({"configuration": "onednn-off"}, "the identify map did not measure layer conv (input (4, 6, 6, 3)"),
            ({"configuration": "nope"}, "the identify map has no results for configuration 'nope'")):
        with pytest.raises(InvalidArgument) as info:
            with use_arithmetic(model, "twin", arithmetic_map=document, **kwargs):
                pass
        assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert "call" not in model.get_layer("conv").__dict__


@pytest.mark.slow  # two configurations, identify and three fits in each: about a minute
def test_the_scripts_fit_the_example_model_natively_as_a_twin_and_under_a_v100(tmp_path):
    def run(*args):
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=900,
                              env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    run(str(REPO / "scripts" / "example_model.py"), "--output", str(tmp_path))
    configurations = ("onednn-off+fp16-acc", "default")
    run("-m", "convprobe", "identify", "--keras-model", "M.keras", "--configs", ",".join(configurations),
        "--output", "map.json")
    for configuration in configurations:
        run(str(REPO / "scripts" / "twin_your_model.py"), "M.keras", "D.npz", "map.json", "--config", configuration,
            "--json", f"{configuration}.json")
        results = json.loads((tmp_path / f"{configuration}.json").read_text())
        assert results["twin"] == {"losses_equal": True, "weights_equal": True}, results
        assert results["counterfactual"]["weights_equal"] is False, results
        assert results["losses"]["v100:out=fp16"] != results["losses"]["native"]
