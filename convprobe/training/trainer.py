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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from convprobe import results
from convprobe.errors import InvalidArgument
from convprobe.training import runtime
from convprobe.training.arithmetic import GPU_PRESET_SCOPE, Arithmetic, ArithmeticKind, read_identify_map
from convprobe.training.cluster import read_tf_config
from convprobe.training.config import LossScaleMode, TrainConfig
from convprobe.training.data import Batches, make_data
from convprobe.training.emulated_conv import emulated_convolution
from convprobe.training.model import build_resnet, conv_shapes, route_convolutions
from convprobe.training.records import (
    IDENTIFY_MAP_NAME,
    STEP_COLUMNS,
    RunFiles,
    TensorNames,
    nonfinite_fields,
    read_header,
    read_summary,
    save_checkpoint,
    telemetry_rows,
)
from convprobe.training.tensorboard import TensorBoardWriter
from convprobe.training.telemetry import (
    COUNT_FIELDS,
    Thresholds,
    backward_order,
    batched_stats,
    nonfinite_counts,
    use_host_tables,
)

__all__ = ["Trainer", "RunResult", "train"]


@dataclass
class RunResult:
    """What a finished (or resumed and finished) run reports."""

    directory: str | None
    steps_run: int
    final_step: int
    skipped_steps: int
    nonfinite_steps: int
    final_loss_scale: float
    final_loss: float
    eval_accuracy: float | None
    images_per_second: float
    jit: bool
    summary: dict = field(default_factory=dict)


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
            "default" if Arithmetic.parse(config.arithmetic).kind is ArithmeticKind.TWIN else None)
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
            common: dict[str, Any] = dict(image_size=self.data.image_size, num_classes=self.data.num_classes,
                          seed=config.seed, bn_momentum=config.bn_momentum)
            self.model = build_resnet(config.resnet_size, dtype=config.dtype, **common)
            self.shadow = build_resnet(config.resnet_size, dtype="fp32", **common)
            inner = keras.optimizers.SGD(learning_rate=config.learning_rate, momentum=config.momentum,
                                         weight_decay=config.weight_decay or None)
            mode, scale = config.loss_scale.mode, config.loss_scale.scale
            if mode is LossScaleMode.DYNAMIC:
                self.optimizer = keras.optimizers.LossScaleOptimizer(
                    inner, initial_scale=scale, dynamic_growth_steps=config.dynamic_growth_steps)
            elif mode is LossScaleMode.STATIC:
                self.optimizer = _fixed_scale_optimizer(inner, scale)
            else:
                self.optimizer = inner
            self.optimizer.build(self.model.trainable_variables)
        self.arithmetic = Arithmetic.parse(config.arithmetic)
        #: each conv layer's arithmetic, forward and both gradients (recorded in the header)
        self.layer_arithmetic = self.arithmetic.layers(
            conv_shapes(self.model, config.batch_size // self.replicas),
            identify_map if config.arithmetic_map is None else read_identify_map(config.arithmetic_map),
            self.configuration or "default")
        route_convolutions(self.model, {name: emulated_convolution(tf, layer)
                                        for name, layer in self.layer_arithmetic.items() if layer.emulated})
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
        self._compile()

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
        tf, keras = self.tf, self.keras
        model = self.model
        variables = model.trainable_variables
        global_batch = tf.cast(self.config.batch_size, tf.float32)
        with tf.GradientTape() as tape:
            outs = model(images, training=True)
            logits, taps = outs[0], [outs[1 + i] for i in self.measured_taps]
            ce = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.reduce_sum(ce) / global_batch
            scaled = loss * scale
        targets = list(variables) + (taps if with_telemetry else [])
        grads = tape.gradient(scaled, targets)
        wgrads = grads[: len(variables)]
        bad_each = tf.cast(nonfinite_counts(wgrads), tf.float32)
        part = {
            "loss": loss,
            "bad": tf.reduce_sum(bad_each),
            "bad_each": bad_each,
            "correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                                                      tf.cast(labels, tf.int32)), tf.float32)),
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
        tf, keras = self.tf, self.keras
        shadow = self.shadow
        global_batch = tf.cast(self.config.batch_size, tf.float32)
        with tf.GradientTape() as tape:
            outs = shadow(tf.cast(images, tf.float32), training=True)
            ce = keras.losses.sparse_categorical_crossentropy(labels, outs[0], from_logits=True)
            scaled = (tf.reduce_sum(ce) / global_batch) * scale
        return tape.gradient(scaled, list(shadow.trainable_variables) + [outs[1 + i] for i in self.measured_taps])

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
            self._predict = lambda i: self.model(i, training=False)[0]
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
        self._predict = tf.function(lambda i: self.model(i, training=False)[0], jit_compile=self.jit)

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
            config = self.config
            raise InvalidArgument(f"the checkpoint does not match this run's model (--resnet-size "
                                  f"{config.resnet_size}, --image-size {config.image_size}): {mismatch}; nothing "
                                  f"was changed: resume it with the model it was saved from, or use a new --output "
                                  f"directory")
        for v, w in zip(self.model.weights, weights):
            v.assign(w)
        for v, w in zip(self.optimizer.variables, optimizer_state):
            v.assign(w)

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


def _number(value) -> float:
    """A summary's number as float; null (no step ran in the call that wrote it) as NaN."""
    return math.nan if value is None else float(value)


def train(config: TrainConfig, *, data: Batches | None = None, trainer: Trainer | None = None,
          stop_after: int | None = None, eager: bool = False, identify_map: dict | None = None) -> RunResult:
    """Run (or resume) a training run, streaming records to `config.output` if set.

    `stop_after` ends the run early after that many steps in this call, leaving
    it as an interrupted run would (records and last checkpoint on disk).
    `eager` runs without graph tracing (see `Trainer`).
    """
    files = RunFiles(config.output) if config.output else None
    run = functools.partial(_run, config, files, data=data, trainer=trainer, stop_after=stop_after, eager=eager,
                            identify_map=identify_map)
    if files is None or not _writes_records(config):
        return run()
    with files.locked():  # a second run on this directory is refused before it changes anything
        return run()


def _writes_records(config: TrainConfig) -> bool:
    """Whether this process writes the run's records: every process but the other workers of
    a cluster (worker 0, the chief, writes them)."""
    return config.distribute != "multi-worker" or read_tf_config().is_chief


def _run(config: TrainConfig, files: RunFiles | None, *, data: Batches | None, trainer: Trainer | None,
         stop_after: int | None, eager: bool, identify_map: dict | None) -> RunResult:
    plan = files.plan(config.to_json()) if files is not None else None  # validates, writes nothing
    start = 0
    counters = {"skipped": 0, "nonfinite": 0}
    if files is not None and plan is not None and plan.start_step >= config.steps and files.summary_path.exists():
        done = read_summary(files.directory)  # already finished: report it, touch nothing
        evaluated = read_header(files.directory)["params"].get("eval_batches", 0)
        if evaluated != config.eval_batches:  # its accuracy would be reported under the wrong setting
            raise InvalidArgument(f"{config.output} finished with --eval-batches {evaluated}; nothing was changed: "
                                  f"rerun it with that value, or train into a new --output")
        return RunResult(
            directory=config.output, steps_run=0, final_step=done["final_step"],
            skipped_steps=done["skipped_steps"], nonfinite_steps=done["nonfinite_steps"],
            final_loss_scale=_number(done["final_loss_scale"]), final_loss=_number(done["final_loss"]),
            eval_accuracy=done["eval_accuracy"], images_per_second=done["median_images_per_second"] or 0.0,
            jit=done["jit"], summary=done)
    trainer = trainer or Trainer(config, data=data, eager=eager, identify_map=identify_map)
    board: TensorBoardWriter | None = None  # the run's TensorBoard event files, where it writes records
    if files is not None:
        assert plan is not None  # (planned wherever there are files)
        if plan.replicas is not None and plan.replicas != trainer.replicas:
            raise InvalidArgument(f"{config.output} was recorded with {plan.replicas} replicas and this run has "
                                  f"{trainer.replicas} (batch-norm statistics would change mid-run); nothing was "
                                  f"changed: resume with as many workers or devices, or use a new --output")
        if plan.checkpoint is not None:
            _, weights, opt_state, counters = plan.checkpoint
            trainer.restore(weights, opt_state)  # a foreign checkpoint fails here, files untouched
        start = plan.start_step
        if trainer.is_chief:  # other workers of a cluster compute the same steps and write nothing
            facts = runtime.runtime_facts()
            facts.update(jit_effective=trainer.jit, jit_scope=trainer.jit_scope, eager=trainer.eager,
                         replicas=trainer.replicas,
                         cluster=None if trainer.cluster is None else list(trainer.cluster.workers))
            start = files.start(plan, config_json=config.to_json(), seed=config.seed,
                                device=trainer.device_description(), runtime=facts,
                                layer_names={"weight": trainer.weight_names, "activation": trainer.tap_names},
                                arithmetic=trainer.arithmetic_record())
            if identify_map is not None and config.arithmetic_map is None:  # measured for this run: keep it
                results.write(files.directory / IDENTIFY_MAP_NAME, identify_map)
            board = TensorBoardWriter(files.tensorboard_path, trainer.format)
        else:
            files = None
    speeds: list[float] = []
    last: dict = {}
    steps_run = 0
    from convprobe.progress import tracker

    try:
        with tracker(config.steps - start, f"train {config.dtype} steps",
                     enabled=config.progress and trainer.is_chief) as advance:
            for step in range(start, config.steps):
                if stop_after is not None and steps_run >= stop_after:
                    break
                telemetry = step % config.record_every == 0
                last = trainer.step(step, telemetry)
                steps_run += 1
                counters["skipped"] += int(last["skipped"])
                counters["nonfinite"] += int(not last["finite"])
                if step > start:  # the first call compiles
                    speeds.append(last["images_per_second"])
                if files is not None:
                    assert board is not None  # (made wherever files are kept: the chief's)
                    files.write_step({k: last[k] for k in STEP_COLUMNS})
                    board.write_step(step, last["loss_scale"], counters["skipped"])
                    if telemetry:
                        rows = trainer.telemetry_rows(last)
                        files.write_telemetry(rows)
                        board.write_records(step, rows)
                    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                        save_checkpoint(files.checkpoint_path, step + 1, *trainer.state(), counters)
                advance(f"loss {last['loss']:.4f}  scale {last['loss_scale']:g}  "
                        f"{last['images_per_second']:.1f} img/s")
        finished = (start + steps_run) >= config.steps
        eval_accuracy = trainer.evaluate(config.eval_batches) if finished else None
        summary: dict[str, Any] = {
            "finished": finished,
            "final_step": start + steps_run,
            "skipped_steps": counters["skipped"],
            "nonfinite_steps": counters["nonfinite"],
            "final_loss_scale": last.get("loss_scale"),
            "final_loss": last.get("loss"),
            "eval_accuracy": eval_accuracy,
            "median_images_per_second": float(np.median(speeds)) if speeds else None,
            "jit": trainer.jit,
            "arithmetic": trainer.arithmetic.text,
            "weights_sha256": trainer.weights_sha256(),
        }
        if files is not None:
            if finished:
                files.finish(summary)
            else:
                files.close()
    finally:
        try:
            if files is not None:
                files.close()
        finally:  # the event files close even when the CSVs could not
            if board is not None:
                board.close()
    return RunResult(
        directory=config.output, steps_run=steps_run, final_step=start + steps_run,
        skipped_steps=counters["skipped"], nonfinite_steps=counters["nonfinite"],
        final_loss_scale=float(last.get("loss_scale", config.loss_scale.scale)),
        final_loss=float(last.get("loss", math.nan)), eval_accuracy=eval_accuracy,
        images_per_second=summary["median_images_per_second"] or 0.0, jit=trainer.jit, summary=summary,
    )


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
