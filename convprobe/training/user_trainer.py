"""`convprobe train --keras-model M.keras --data D.npz`: the user's own saved, compiled Keras
model trained as convprobe trains its ResNet: the same step, loss scaling, telemetry against
an fp32 shadow, records, checkpoints and resume (`run_loop`), with the model's own compiled
loss and optimizer, its layers under the run's arithmetic through `use_arithmetic`.

What the run changes in the user's model, and says in its header: the model computes in the
run's dtype (a model saved in another policy is cloned into it, its weights copied); its
optimizer is a fresh one of the same configuration, wrapped in the run's loss scaling; the
watched tensors are every trainable weight and the output of every layer with one output
(a functional model's). The data file's inputs reach the model as they are.

Keras and TensorFlow are imported inside the functions: a run's configuration must be in
the environment before TensorFlow starts (`Trainer`).
"""

from __future__ import annotations

import contextlib
import json
import warnings
import zipfile
from typing import Any

import numpy as np

from convprobe.errors import InvalidArgument, reason
from convprobe.files import check_model_file
from convprobe.formats import format_of_dtype
from convprobe.training.arithmetic import ArithmeticKind, read_identify_map
from convprobe.training.config import TrainConfig
from convprobe.training.data import ArrayData
from convprobe.training.records import TensorNames
from convprobe.training.telemetry import backward_order
from convprobe.training.trainer import Trainer

__all__ = ["POLICIES", "UserModelTrainer", "saved_batch_size", "load_user_model", "check_user_model"]

#: The Keras policy of each compute dtype a run names.
POLICIES = {"fp16": "mixed_float16", "bf16": "mixed_bfloat16", "fp32": "float32"}
#: Layers Keras computes in fp32 under a mixed policy: their weight gradients cannot flush.
_FP32_LAYERS = ("BatchNormalization", "LayerNormalization", "GroupNormalization")


def saved_batch_size(path: str) -> int | None:
    """The batch size a saved model's input fixes (keras.Input(..., batch_size=N)), read from the
    .keras file's config without TensorFlow (the run's default --batch-size); None where it
    fixes none or the file is no .keras archive (Keras then reads it, and says what is wrong)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    layers = (config.get("config") or {}).get("layers") or []
    batches = {(layer.get("config") or {}).get("batch_shape", [None])[0] for layer in layers
               if layer.get("class_name") == "InputLayer"}
    return batches.pop() if len(batches) == 1 and None not in batches else None


def load_user_model(path: str):
    """The saved model at `path`, compiled as it was saved; one line where the file is not a
    Keras model or the model was saved without compile (it has no loss to train)."""
    import keras

    where = f"--keras-model {path!r}"
    file = check_model_file(path, where)
    try:
        with warnings.catch_warnings():  # its saved optimizer's variables: the run trains with a fresh one
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            model = keras.models.load_model(file)
    except Exception as error:  # noqa: BLE001 - any load failure is bad input, in one line
        raise InvalidArgument(f"{where} could not be loaded as a Keras model: {reason(error)}") from None
    if not model.compiled or model.loss is None or model.optimizer is None:
        raise InvalidArgument(f"{where} is not compiled: train reads its loss and optimizer; compile it "
                              f"(model.compile(optimizer=..., loss=...)) before model.save")
    return model


def check_user_model(model, data: ArrayData, config: TrainConfig) -> None:
    """The data fits the model: the inputs' shape, the model's fixed batch, and the labels its
    compiled loss takes (one batch through the model and its loss); one line if not."""
    x = data.x_train
    if config.eval_batches > 0 and not data.has_test:
        raise InvalidArgument(f"--eval-batches {config.eval_batches} reads x_test and y_test, which --data does not "
                              f"hold; add them, or give --eval-batches 0")
    symbolic = getattr(model, "inputs", None)  # a subclassed model has none
    inputs = [tuple(t.shape) for t in symbolic] if symbolic else None
    if inputs is None or len(inputs) != 1:
        raise InvalidArgument(f"--keras-model must have one input (train feeds x_train); received a model with "
                              f"{len(inputs or [])}")
    expected = inputs[0]
    if len(expected) != x.ndim or any(e is not None and e != got for e, got in zip(expected[1:], x.shape[1:])):
        raise InvalidArgument(f"--data x_train's samples are {x.shape[1:]} and the model takes "
                              f"{tuple(expected[1:])}: the data does not fit the model")
    if expected[0] is not None and expected[0] != config.batch_size:
        raise InvalidArgument(f"--batch-size must be the batch the model's input fixes ({expected[0]}); received "
                              f"{config.batch_size}")
    if data.has_test and data.arrays["x_test"].shape[1:] != x.shape[1:]:
        raise InvalidArgument(f"--data x_test's samples are {data.arrays['x_test'].shape[1:]} and x_train's "
                              f"{x.shape[1:]}: they must be alike")
    pairs = [("y_train", data.batch(0, config.batch_size))]
    if data.has_test:
        pairs.append(("y_test", data.eval_batch(0, config.batch_size)))
    for name, (images, labels) in pairs:
        try:
            model.compute_loss(x=images, y=labels, y_pred=model(images, training=False), training=False)
        except Exception as error:  # noqa: BLE001 - the user's loss refusing the labels is bad input
            loss = model.loss if isinstance(model.loss, str) else type(model.loss).__name__
            raise InvalidArgument(f"--data {name} does not fit the model's loss ({loss}): {reason(error)}") from None


def _layers_policy(model) -> str:
    """The policy most of the model's layers with weights compute in (a model's own policy says
    nothing once it is loaded; a float32 output layer is the exception a mixed model keeps)."""
    names = [layer.dtype_policy.name for layer in model._flatten_layers(include_self=False)
             if layer.weights and not layer._layers]
    return max(sorted(set(names)), key=names.count) if names else model.dtype_policy.name


class UserModelTrainer(Trainer):
    """`Trainer` over the user's saved model and arrays (module docstring)."""

    def _build_models(self) -> None:
        from convprobe.training.model_copies import copy_model, forward_with_taps, functional, single_output

        config = self.config
        if config.distribute != "none":
            raise InvalidArgument(f"--keras-model trains in one process on one device; received --distribute "
                                  f"{config.distribute}")
        assert config.keras_model is not None, "a user-model run names its model (validate_config)"
        saved = load_user_model(config.keras_model)
        if not isinstance(self.data, ArrayData):
            raise InvalidArgument("--keras-model trains on --data FILE.npz")
        check_user_model(saved, self.data, config)
        self.saved_optimizer = saved.optimizer
        policy, own = POLICIES[config.dtype], _layers_policy(saved)
        self.policy_note = f"the model's own policy, {own} (its layers with weights)"
        if own != policy:
            self.model = copy_model(saved, policy)
            self.model.set_weights(saved.get_weights())
            self.model.compile(loss=saved.loss, jit_compile=False)  # the user's loss, on the clone's predictions
            self.policy_note = f"cloned from {own} into {policy}, every layer, weights copied"
        else:
            self.model = saved
        self.shadow = copy_model(self.model, "float32")
        self.shadow.compile(loss=saved.loss, jit_compile=False)
        layers = [layer for layer in self.model.layers if not isinstance(layer, self.keras.layers.InputLayer)]
        self.tap_names = [layer.name for layer in layers if functional(self.model) and single_output(layer)]
        self._forwards = {id(self.model): forward_with_taps(self.model, self.tap_names),
                          id(self.shadow): forward_with_taps(self.shadow, self.tap_names)}

    def _inner_optimizer(self):
        optimizer = self.saved_optimizer
        inner = getattr(optimizer, "inner_optimizer", optimizer)  # its own loss scaling gives way to the run's
        return type(inner).from_config(inner.get_config())

    def _route(self, identify_map: dict | None) -> None:
        from convprobe.training.model_arithmetic import use_arithmetic

        config = self.config
        twin = self.arithmetic.kind is ArithmeticKind.TWIN
        chosen = (identify_map if config.arithmetic_map is None else read_identify_map(config.arithmetic_map)) \
            if twin else None
        self._stack = contextlib.ExitStack()  # held for the trainer's life: the model is its own copy
        self.layer_record = self._stack.enter_context(use_arithmetic(
            self.model, self.arithmetic.text, arithmetic_map=chosen,
            configuration=self.configuration if twin else None))
        self.layer_arithmetic = {}

    def _name_tensors(self) -> None:
        model = self.model
        variables = model.trainable_variables
        owner = {id(v): layer for layer in model._flatten_layers(include_self=False) for v in layer.trainable_variables}
        self.weight_names = [v.path for v in variables]
        self.measured_taps = list(range(len(self.tap_names)))
        self.report_rows = np.arange(len(self.weight_names) + len(self.tap_names))
        compute = str(self.format.name)
        self.precision = [
            "fp32" if type(owner.get(id(v))).__name__ in _FP32_LAYERS or getattr(owner.get(id(v)), "compute_dtype",
                                                                                 None) == "float32" else compute
            for v in variables] + [format_of_dtype(np.dtype(model.get_layer(name).output.dtype)).name
                                   for name in self.tap_names]
        self.same_gradient_as = [""] * len(self.precision)
        self.names = TensorNames(self.weight_names, self.tap_names, self.precision, self.same_gradient_as)
        self.backward = backward_order(model, variables, self.tap_names)

    def _forward(self, model, images, training: bool):
        return self._forwards[id(model)](images, training=training)

    def _loss(self, model, images, labels, predictions):
        return model.compute_loss(x=images, y=labels, y_pred=predictions, training=True)

    @staticmethod
    def _classifies(predictions_shape, labels) -> bool:
        """Whether accuracy means something here: class indices against a (batch, classes > 1)
        output (argmax); not for one-hot labels, a sigmoid unit or a sequence."""
        return (len(predictions_shape) == 2 and (predictions_shape[-1] or 0) > 1 and len(labels.shape) == 1
                and np.dtype(labels.dtype.as_numpy_dtype if hasattr(labels.dtype, "as_numpy_dtype")
                             else labels.dtype).kind in "iu")

    def _correct(self, predictions, labels):
        """Correct class predictions (`_classifies`); NaN where accuracy has no such meaning."""
        if not self._classifies(tuple(predictions.shape), labels):
            return self.tf.constant(np.nan, self.tf.float32)
        return super()._correct(predictions, labels)

    def evaluate(self, batches: int) -> float | None:
        """Accuracy over the test batches, or None where it has no meaning (`_classifies`)."""
        if batches <= 0:
            return None
        _, labels = self.data.eval_batch(0, self.config.batch_size)
        if not self._classifies(tuple(self.model.outputs[0].shape) if getattr(self.model, "outputs", None)
                                else (None, None, None), labels):
            return None
        return super().evaluate(batches)

    def model_words(self) -> str:
        return f"--keras-model {self.config.keras_model}"

    def arithmetic_record(self) -> dict:
        """What each layer computed (`use_arithmetic`'s record), for the run's header."""
        record: dict[str, Any] = dict(self.layer_record)
        ops = [cell for layer in record["layers"] for cell in layer["ops"].values()]
        record.update(kind=str(self.arithmetic.kind), configuration=self.configuration,
                      arithmetic=self.arithmetic.text, arithmetic_map=self.config.arithmetic_map,
                      emulated_ops=sum(cell["arithmetic"] != "tensorflow" for cell in ops),
                      tensorflow_ops=sum(cell["arithmetic"] == "tensorflow" for cell in ops),
                      policy=self.policy_note,
                      scope="the forward pass and both gradients of every layer listed; every other op (the "
                            "layers not computed, the loss, the optimizer) runs TensorFlow's kernels")
        return record
