"""The training loop: ResNet, loss scaling, fp32 shadow telemetry, records.

One `Trainer` per run. A step is a single compiled function (XLA when
`config.jit`): forward in the compute dtype, loss (fp32 logits, mean over the
global batch), scaled by S, one `tape.gradient` for the weight gradients and
(on telemetry steps) the activation gradients, then the update:

- `none`: S = 1, the update is applied even if a gradient is inf/NaN;
- `static`: fixed S, unscale, skip the whole update if any weight gradient is
  non-finite (a `LossScaleOptimizer` whose scale never moves);
- `static-no-skip`: fixed S, unscale and apply regardless, which is what the
  reference ResNet did (`compute_gradients(loss * loss_scale)`, then divide);
- `dynamic`: `keras.optimizers.LossScaleOptimizer` (halve S and skip on
  inf/NaN, double after `dynamic_growth_steps` finite steps).

On a telemetry step an fp32 shadow model first receives the current weights,
then runs the same batch on the same scaled loss inside the training step, and
a second compiled function (`telemetry.batched_stats`) compares every gradient
with its shadow. The gradients measured are exactly the ones the update uses.
A tap whose gradient is the same tensor as another's (`model.tap_same_gradient`)
is measured once and reported under both names.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import time
from typing import Any

import numpy as np

from convprobe.errors import InvalidArgument
from convprobe.training import runtime
from convprobe.training.arithmetic import GPU_PRESET_SCOPE, ArithmeticKind, read_identify_map
from convprobe.training.cluster import read_tf_config
from convprobe.training.config import LossScaleMode, TrainConfig
from convprobe.training.data import Batches, make_data
from convprobe.training.emulated_conv import emulated_convolution
from convprobe.training.model import build_resnet, conv_shapes, route_convolutions
from convprobe.training.records import (
    TensorNames,
    nonfinite_fields,
    telemetry_rows,
)
from convprobe.training.telemetry import (
    COUNT_FIELDS,
    Thresholds,
    backward_order,
    batched_stats,
    nonfinite_counts,
    use_host_tables,
    zeros_for_none,
)

__all__ = ["Trainer"]


def _fixed_scale_optimizer(inner, scale: float):
    """A LossScaleOptimizer whose scale never changes: skip-on-inf, static S.

    Reuses Keras's distribution-aware finite check and skip; only the scale
    updates are removed.
    """
    import keras
    from keras import ops

    class FixedLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
        def _stateful_handle_finite_grads(self, grads, trainable_variables):
            scale_ = self.dynamic_scale
            unscaled = [g if g is None else ops.divide(g, scale_) for g in grads]
            self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)

        def _stateful_handle_non_finite_grads(self):
            return None

    return FixedLossScaleOptimizer(inner, initial_scale=scale, dynamic_growth_steps=2**30,
                                   name="fixed_loss_scale")


class Trainer:
    """Builds the model, its fp32 shadow, the optimizer and the compiled steps."""

    def __init__(self, config: TrainConfig, data: Batches | None = None, *, eager: bool = False,
                 identify_map: dict | None = None):
        """`eager=True` runs the steps op by op without tracing a graph (same arithmetic
        as the graph without XLA, no tracing cost: for tests and debugging). `identify_map`
        is the twin's map where `config.arithmetic_map` names none."""
        self.config = config
        self.eager = eager
        mirrored = config.distribute == "mirrored"
        #: The twin computes in the configuration identify measured ('default' unless named):
        #: the switches the matrix manages are set as identify's child had them.
        self.configuration = config.configuration or (
            "default" if config.arithmetic.kind is ArithmeticKind.TWIN else None)
        if self.configuration is not None:
            runtime.apply_configuration(self.configuration)
        self.tf = tf = runtime.tensorflow(config.logical_devices if mirrored else None,
                                          initialise=config.distribute != "multi-worker")
        self.cluster = None
        if config.distribute == "multi-worker":  # first, before any other op (TensorFlow's rule)
            self.cluster = read_tf_config()
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        import keras

        self.keras = keras
        random.seed(config.seed)
        np.random.seed(config.seed)
        keras.utils.set_random_seed(config.seed)
        self.data = data if data is not None else make_data(config)
        self.format = config.format
        self.thresholds = Thresholds.of(self.format)
        if mirrored:
            cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
            if len(cpus) < 2:
                raise InvalidArgument(
                    f"--distribute mirrored needs at least 2 devices; this process has {len(cpus)} "
                    "(logical CPU devices must be configured before TensorFlow initialises, in a fresh process)"
                )
            self.strategy = tf.distribute.MirroredStrategy(cpus[: config.logical_devices])
        elif self.cluster is None:
            self.strategy = tf.distribute.get_strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        if config.batch_size % self.replicas:
            raise InvalidArgument(f"--batch-size must be a multiple of the {self.replicas} replicas; "
                                  f"received {config.batch_size}")
        self.is_chief = self.cluster is None or self.cluster.is_chief
        self.jit = bool(config.jit) and not eager
        self.jit_scope = None if not self.jit else (
            "the whole step" if self.replicas == 1 else
            "each replica's forward and backward pass and telemetry statistics; the cross-replica sums "
            "and the optimizer's update run outside XLA (it cannot compile the Keras optimizer's "
            "cross-replica calls)")

        with self.strategy.scope():
            self._build_models()
            mode, scale = config.loss_scale.mode, config.loss_scale.scale
            inner = self._inner_optimizer()
            if mode is LossScaleMode.DYNAMIC:
                self.optimizer = keras.optimizers.LossScaleOptimizer(
                    inner, initial_scale=scale, dynamic_growth_steps=config.dynamic_growth_steps)
            elif mode is LossScaleMode.STATIC:
                self.optimizer = _fixed_scale_optimizer(inner, scale)
            else:
                self.optimizer = inner
            self.optimizer.build(self.model.trainable_variables)
        self.arithmetic = config.arithmetic
        self._route(identify_map)
        self._name_tensors()
        self._compile()

    # -- the model: convprobe's ResNet (a subclass trains another) -----------------------
    def _build_models(self) -> None:
        """The model in the run's dtype and its fp32 shadow."""
        config = self.config
        assert config.resnet_size is not None, "a ResNet run names its depth (validate_config)"
        common: dict[str, Any] = dict(image_size=self.data.image_size, num_classes=self.data.num_classes,
                                      seed=config.seed, bn_momentum=config.bn_momentum)
        self.model = build_resnet(config.resnet_size, dtype=config.dtype, **common)
        self.shadow = build_resnet(config.resnet_size, dtype="fp32", **common)

    def _inner_optimizer(self):
        """The optimizer the loss scaling wraps."""
        config = self.config
        return self.keras.optimizers.SGD(learning_rate=config.learning_rate, momentum=config.momentum,
                                         weight_decay=config.weight_decay or None)

    def _route(self, identify_map: dict | None) -> None:
        """Each conv layer's arithmetic, forward and both gradients (recorded in the header), and
        the layers rerouted to it."""
        config = self.config
        self.layer_arithmetic = self.arithmetic.layers(
            conv_shapes(self.model, config.batch_size // self.replicas),
            identify_map if config.arithmetic_map is None else read_identify_map(config.arithmetic_map),
            self.configuration or "default")
        route_convolutions(self.model, {name: emulated_convolution(self.tf, layer)
                                        for name, layer in self.layer_arithmetic.items() if layer.emulated})

    def _name_tensors(self) -> None:
        """The reported tensors (weights, then the activations whose gradients are tapped), their
        precision, and the order the backward pass computes them."""
        self.weight_names = [v.path for v in self.model.trainable_variables]
        self.tap_names = list(self.model.tap_names)
        # Taps whose gradient is another tap's tensor are measured once and reported under both names.
        same = self.model.tap_same_gradient
        self.measured_taps = [i for i in range(len(self.tap_names)) if i not in same]
        position = {tap: k for k, tap in enumerate(self.measured_taps)}
        n_weights = len(self.weight_names)
        #: row of the measured statistics that each reported tensor (weights, then taps) takes
        self.report_rows = np.array(list(range(n_weights)) + [
            n_weights + position[same.get(i, i)] for i in range(len(self.tap_names))])
        # Batch-norm parameters are computed in fp32 under mixed precision: they cannot flush.
        compute = str(self.format.name)
        self.precision = ["fp32" if "_bn/" in name else compute for name in self.weight_names] + \
            [compute] * len(self.tap_names)
        self.same_gradient_as = [""] * n_weights + [
            self.tap_names[same[i]] if i in same else "" for i in range(len(self.tap_names))]
        self.names = TensorNames(self.weight_names, self.tap_names, self.precision, self.same_gradient_as)
        #: the reported tensors in the order the backward pass computes their gradients
        self.backward = backward_order(self.model, self.model.trainable_variables, self.tap_names)

    def _forward(self, model, images, training: bool):
        """(predictions, the measured taps' outputs) of `model` (the run's or its shadow)."""
        outs = model(images, training=training)
        return outs[0], [outs[1 + i] for i in self.measured_taps]

    def _loss(self, model, images, labels, predictions):
        """The mean loss over the global batch (each replica's share)."""
        tf = self.tf
        ce = self.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
        return tf.reduce_sum(ce) / tf.cast(self.config.batch_size, tf.float32)

    def _correct(self, predictions, labels):
        """How many of the batch's predictions name their label."""
        tf = self.tf
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(predictions, axis=-1, output_type=tf.int32),
                                              tf.cast(labels, tf.int32)), tf.float32))

    # -- compiled pieces ---------------------------------------------------------------
    def _current_scale(self):
        tf = self.tf
        if hasattr(self.optimizer, "dynamic_scale"):
            return tf.identity(self.optimizer.dynamic_scale)
        return tf.constant(self.config.loss_scale.scale, tf.float32)

    def _gradients(self, images, labels, scale, with_telemetry: bool) -> dict:
        """This replica's forward and backward pass (and the fp32 shadow's, for telemetry): the
        heavy part of a step, free of cross-replica calls, so XLA can compile it on its own
        under a strategy."""
        tf = self.tf
        model = self.model
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            predictions, taps = self._forward(model, images, training=True)
            loss = self._loss(model, images, labels, predictions)
            scaled = tf.cast(loss, tf.float32) * scale
        targets = list(variables) + (taps if with_telemetry else [])
        grads = zeros_for_none(tape.gradient(scaled, targets), targets)
        wgrads = grads[: len(variables)]
        bad_each = tf.cast(nonfinite_counts(wgrads), tf.float32)
        part = {
            "loss": tf.cast(loss, tf.float32),
            "bad": tf.reduce_sum(bad_each),
            "bad_each": bad_each,
            "correct": self._correct(predictions, labels),
            "wgrads": list(wgrads),
        }
        if with_telemetry:
            part["tapgrads"] = list(grads[len(variables):])
            part["shadows"] = self._shadow_gradients(images, labels, scale)
        return part

    def _replica_step(self, images, labels, with_telemetry: bool):
        variables = self.model.trainable_variables
        scale = self._current_scale()
        part = self._grads[with_telemetry](images, labels, scale)
        wgrads = part["wgrads"]
        finite = self.tf.equal(self._sum_over_replicas(part["bad"]), 0.0)
        out = {
            "nonfinite": self._sum_over_replicas(part["bad_each"]),
            "loss": self._sum_over_replicas(part["loss"]),  # each replica's share is over the global batch
            "correct": self._sum_over_replicas(part["correct"]),
            "scale": scale,
            "finite": finite,
        }
        if with_telemetry:
            out["lows"] = list(wgrads) + part["tapgrads"]
            out["shadows"] = part["shadows"]
        mode = self.config.loss_scale.mode
        if mode in (LossScaleMode.STATIC, LossScaleMode.DYNAMIC):
            self.optimizer.apply(wgrads, variables)
        elif mode is LossScaleMode.STATIC_NO_SKIP:
            self.optimizer.apply([g / scale for g in wgrads], variables)
        else:
            self.optimizer.apply(wgrads, variables)
        return out

    def _shadow_gradients(self, images, labels, scale):
        tf = self.tf
        shadow = self.shadow
        with tf.GradientTape() as tape:
            predictions, taps = self._forward(shadow, tf.cast(images, tf.float32), training=True)
            scaled = tf.cast(self._loss(shadow, images, labels, predictions), tf.float32) * scale
        targets = list(shadow.trainable_variables) + taps
        return zeros_for_none(tape.gradient(scaled, targets), targets)

    def _sum_over_replicas(self, value):
        """`value` summed over every replica of every worker (itself with one replica)."""
        ctx = self.tf.distribute.get_replica_context()
        if ctx is None or self.replicas == 1:
            return value
        return ctx.all_reduce(self.tf.distribute.ReduceOp.SUM, value)

    def _statistics(self, lows, shadows):
        """Telemetry of this replica's gradients, aggregated over all replicas: counts and
        histograms summed, extremes the smallest minimum and largest maximum."""
        tf = self.tf
        counts, extremes, hist_low, hist_shadow, counterfactual = self._batched_stats(lows, shadows)
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and self.replicas > 1:
            counts, hist_low, hist_shadow, counterfactual = (
                self._sum_over_replicas(x) for x in (counts, hist_low, hist_shadow, counterfactual))
            every = ctx.all_gather(extremes[None], axis=0)  # [replicas, tensors, 2]
            extremes = tf.stack([tf.reduce_min(every[..., 0], axis=0), tf.reduce_max(every[..., 1], axis=0)], axis=-1)
        return {"counts": counts, "extremes": extremes, "hist_low": hist_low, "hist_shadow": hist_shadow,
                "counterfactual": counterfactual}

    def _compile(self):
        tf = self.tf
        strategy = self.strategy

        def copy_weights():
            for target, source in zip(self.shadow.weights, self.model.weights):
                target.assign(tf.cast(source, target.dtype))

        self._grads = {flag: functools.partial(self._gradients, with_telemetry=flag) for flag in (False, True)}
        host = use_host_tables(self.jit)  # on a CPU without XLA: one compiled loop counts the tables
        self._batched_stats = lambda lows, shadows: batched_stats(lows, shadows, self.thresholds, host=host)
        if self.eager:
            self._copy = copy_weights
            self._plain = lambda images, labels: self._replica_step(images, labels, False)
            self._telem = lambda images, labels: self._replica_step(images, labels, True)
            self._stats = self._statistics
            self._predict = lambda i: self._forward(self.model, i, training=False)[0]
            return
        self._copy = tf.function(copy_weights)
        if self.replicas > 1:
            # Under a strategy XLA compiles each replica's collective-free pieces on their own;
            # the cross-replica sums and the optimizer's update run outside them.
            self._grads = {flag: tf.function(functools.partial(self._gradients, with_telemetry=flag),
                                             jit_compile=self.jit) for flag in (False, True)}
            self._batched_stats = tf.function(
                lambda lows, shadows: batched_stats(lows, shadows, self.thresholds, host=host), jit_compile=self.jit)
            def plain(images, labels):
                return strategy.run(self._replica_step, args=(images, labels, False))

            def telem(images, labels):
                return strategy.run(self._replica_step, args=(images, labels, True))

            def stats(lows, shadows):
                return strategy.run(self._statistics, args=(lows, shadows))

            self._plain = tf.function(plain)
            self._telem = tf.function(telem)
            self._stats = tf.function(stats)
        else:
            self._plain = tf.function(lambda images, labels: self._replica_step(images, labels, False),
                                      jit_compile=self.jit)
            self._telem = tf.function(lambda images, labels: self._replica_step(images, labels, True),
                                      jit_compile=self.jit)
            # A separate compiled function: inside the step, XLA fuses the statistics into the
            # backward pass's fusions and recomputes them (measured ~4x slower on ResNet-20).
            self._stats = tf.function(self._statistics, jit_compile=self.jit)
        self._predict = tf.function(lambda i: self._forward(self.model, i, training=False)[0], jit_compile=self.jit)

    def _distribute(self, images: np.ndarray, labels: np.ndarray):
        if self.replicas == 1:
            return self.tf.constant(images), self.tf.constant(labels)
        per = len(labels) // self.replicas

        def split(array):
            return self.strategy.experimental_distribute_values_from_function(
                lambda ctx: self.tf.constant(array[ctx.replica_id_in_sync_group * per:
                                                   (ctx.replica_id_in_sync_group + 1) * per]))

        return split(images), split(labels)

    def _local(self, value) -> list[np.ndarray]:
        return [np.asarray(v) for v in self.strategy.experimental_local_results(value)]

    # -- public steps ------------------------------------------------------------------
    def step(self, step: int, telemetry: bool) -> dict:
        """Run training step `step` (its batch is a function of seed and step)."""
        images, labels = self.data.batch(step, self.config.batch_size)
        images, labels = self._distribute(images, labels)
        start = time.perf_counter()
        if telemetry:
            self._copy()
            out = self._telem(images, labels)
            out.update(self._stats(out.pop("lows"), out.pop("shadows")))
        else:
            out = self._plain(images, labels)
        first = {key: self._local(value)[0] for key, value in out.items()}  # every replica holds the total
        seconds = time.perf_counter() - start
        result: dict[str, Any] = {
            "step": step,
            "loss": float(first["loss"]),
            "accuracy": float(first["correct"]) / self.config.batch_size,
            "loss_scale": float(first["scale"]),
            "finite": bool(first["finite"]),
            "step_seconds": seconds,
            "images_per_second": self.config.batch_size / seconds if seconds > 0 else math.inf,
            "telemetry": telemetry,
        }
        n_weights = len(self.weight_names)
        nonfinite = np.zeros(n_weights + len(self.tap_names), dtype=np.int64)
        nonfinite[:n_weights] = first["nonfinite"]
        if telemetry:
            rows = self.report_rows
            result["counts"] = first["counts"][rows]
            result["min_abs"] = first["extremes"][:, 0][rows]
            result["max_abs"] = first["extremes"][:, 1][rows]
            result["hist_low"] = first["hist_low"][rows]
            result["hist_shadow"] = first["hist_shadow"][rows]
            result["counterfactual"] = first["counterfactual"][rows]
            fields = {name: i for i, name in enumerate(COUNT_FIELDS)}
            nonfinite[n_weights:] = (result["counts"][:, fields["inf"]] + result["counts"][:, fields["nan"]])[n_weights:]
        measured = [True] * n_weights + [telemetry] * len(self.tap_names)
        result.update(nonfinite_fields(self.names, nonfinite, self.backward, measured=measured))
        mode = self.config.loss_scale.mode
        result["skipped"] = (not result["finite"]) and mode in (LossScaleMode.STATIC, LossScaleMode.DYNAMIC)
        return result

    def telemetry_rows(self, result: dict) -> list[dict]:
        """One record per tensor of a telemetry step (`records.telemetry_rows`)."""
        return telemetry_rows(result["step"], result["loss_scale"], self.names, result)

    def evaluate(self, batches: int) -> float | None:
        if batches <= 0:
            return None
        correct = total = 0
        for index in range(batches):
            images, labels = self.data.eval_batch(index, self.config.batch_size)
            logits = np.asarray(self._predict(self.tf.constant(images)))
            correct += int(np.sum(np.argmax(logits, axis=-1) == labels))
            total += len(labels)
        return correct / total

    # -- state -------------------------------------------------------------------------
    def state(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return ([np.asarray(v.numpy()) for v in self.model.weights],
                [np.asarray(v.numpy()) for v in self.optimizer.variables])

    def restore(self, weights: list[np.ndarray], optimizer_state: list[np.ndarray]) -> None:
        mismatch = _checkpoint_mismatch(self.model.weights, weights, "weights") or _checkpoint_mismatch(
            self.optimizer.variables, optimizer_state, "optimizer variables")
        if mismatch:
            raise InvalidArgument(f"the checkpoint does not match this run's model ({self.model_words()}): "
                                  f"{mismatch}; nothing was changed: resume it with the model it was saved from, or "
                                  f"use a new --output directory")
        for v, w in zip(self.model.weights, weights):
            v.assign(w)
        for v, w in zip(self.optimizer.variables, optimizer_state):
            v.assign(w)

    def model_words(self) -> str:
        """The run's model in the options that chose it."""
        return f"--resnet-size {self.config.resnet_size}, --image-size {self.config.image_size}"

    def arithmetic_record(self) -> dict:
        """What each conv layer computed, for the run's header."""
        ops = [op for layer in self.layer_arithmetic.values() for op in layer.ops.values()]
        record = {
            "arithmetic": self.arithmetic.text,
            "kind": str(self.arithmetic.kind),
            "configuration": self.configuration,
            "arithmetic_map": self.config.arithmetic_map,
            "emulated_ops": sum(op.model is not None for op in ops),
            "tensorflow_ops": sum(op.model is None for op in ops),
            "scope": ("the forward convolution and both gradients of every Conv2D layer; every other op "
                      "(batch norm, the dense layer, the loss, the optimizer) runs TensorFlow's kernels"),
            "layers": [layer.to_dict() for layer in self.layer_arithmetic.values()],
        }
        if self.arithmetic.gpu_preset:
            record["gpu_preset"] = GPU_PRESET_SCOPE
        return record

    def weights_sha256(self) -> str:
        """SHA-256 of the fp32 master weights' bytes, in variable order: two runs that
        trained bit for bit alike have the same."""
        digest = hashlib.sha256()
        for variable in self.model.trainable_variables:
            digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
        return digest.hexdigest()

    def device_description(self) -> str:
        return ", ".join(d.name for d in self.tf.config.list_logical_devices()) + \
            f" ({self.replicas} replica{'s' if self.replicas > 1 else ''})"


def _checkpoint_mismatch(variables, arrays, what: str) -> str | None:
    """How a checkpoint's arrays differ from the model's `variables`: both counts, or the first
    variable whose shape differs with both shapes; None when they match."""
    if len(arrays) != len(variables):
        return f"it holds {len(arrays)} {what}, this model has {len(variables)}"
    for variable, array in zip(variables, arrays):
        if tuple(variable.shape) != np.shape(array):
            return (f"{what[:-1] if what.endswith('s') else what} {variable.path} is {tuple(variable.shape)} here "
                    f"and {np.shape(array)} in the checkpoint")
    return None
