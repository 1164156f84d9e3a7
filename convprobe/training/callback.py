"""`UnderflowTelemetry`: convprobe's gradient-underflow telemetry for any Keras model's `fit`.

    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), loss=...)
    model.fit(x, y, callbacks=[UnderflowTelemetry("runs/mine", every=10)])

Every `every` steps it measures the gradients of the user's compiled loss, on the
current batch, scaled by the current loss scale, with respect to the trainable
weights and the outputs of the watched layers, once in the model's compute dtype
and once in an fp32 shadow, and classifies every element as `convprobe train`
does (`telemetry.batched_stats`; rows through
`records.telemetry_rows`, the same code path). It writes a run directory that
`convprobe report DIR` and `assert_no_gradient_underflow(DIR)` read (header.json,
steps.csv, telemetry.csv, summary.json) and TensorBoard event files in
DIR/tensorboard/.

How it sees the batch: Keras 3's `fit` hands callbacks no batch, so the callback wraps
the model's `train_step` for the length of the fit (an instance attribute; the train
function is rebuilt around it). With Keras's own step and one output the wrapper is that
step with the watched layers' outputs among the tape's targets, so a measured step
classifies the very gradients its update applies; with a custom step or several outputs,
a copy of the model in its own policy gives the low-precision gradients
(`model_copies`). A `tf.cond` on the step counter decides, or under XLA and several
replicas the choice of one of two train functions before each step
(`_chosen_functions`). Every step is recorded whatever `steps_per_execution` (buffer
slots flushed once per execution), a skipped step is measured after its skip so that its
record names the overflowing tensors, and the user's training is bit for bit what it is
without the callback (tested). The method, the lifecycle (what is checked before anything
is written, a fit stopped early, `with`), subclassed models and strategies are in the
guide's "Your own Keras model" section. One file for one class: its lifecycle and its
compiled step share the callback's state (the model copies are `model_copies`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import math
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src import tree
from keras.src.losses import loss as loss_module
from keras.src.trainers.data_adapters import data_adapter_utils

from convprobe.errors import InvalidArgument, is_integer
from convprobe.formats import format_of_dtype
from convprobe.training.model_copies import copy_model, forward_with_taps, functional, one_output, single_output
from convprobe.training.records import (
    STEP_COLUMNS,
    ResumePlan,
    RunFiles,
    TensorNames,
    nonfinite_fields,
    telemetry_rows,
)
from convprobe.training.tensorboard import TensorBoardWriter
from convprobe.training.telemetry import (
    COUNT_FIELDS,
    COUNTERFACTUAL_FIELDS,
    N_BINS,
    Thresholds,
    backward_order,
    batched_stats,
    use_host_tables,
    zeros_for_none,
)

__all__ = ["UnderflowTelemetry"]

#: A step's row in the status buffer: one read per execution gives every step's record.
_STATUS = ("step", "loss_scale", "skipped", "measured", "batch", "loss", "accuracy")
#: The log keys of the accuracy column, first present wins.
_ACCURACY = ("accuracy", "sparse_categorical_accuracy")

#: Layers that compute in fp32 under a mixed policy (Keras upcasts their inputs): their weight
#: gradients cannot flush, as batch-norm parameters in `convprobe train`.
_FP32_LAYERS = ("BatchNormalization", "LayerNormalization", "GroupNormalization")


class UnderflowTelemetry(keras.callbacks.Callback):
    """Per-layer gradient underflow of a mixed-precision `fit`, against an fp32 shadow.

    `directory`: a new or empty directory (one per `fit`: a second `fit` needs a new
    directory and a new callback); `every`: measure
    steps 0, every, 2*every, ... (positive integer); `watch`: layer names or globs whose
    weights and outputs are measured (None: every layer with trainable weights, and every
    layer's output).
    """

    def __init__(self, directory, every: int = 100, watch=None):
        super().__init__()
        if not isinstance(directory, (str, Path)) or not str(directory).strip():
            raise InvalidArgument(f"directory must be a path (str or Path); received {directory!r}")
        if not is_integer(every) or every < 1:
            raise InvalidArgument(f"every must be a positive integer (measure every N steps); received {every!r}")
        if watch is not None and (isinstance(watch, str) or not all(isinstance(w, str) for w in watch)):
            watch = [watch] if isinstance(watch, str) else watch
            if not all(isinstance(w, str) for w in watch):
                raise InvalidArgument(f"watch must be None or a list of layer names or globs; received {watch!r}")
        self.directory = Path(directory)
        self.every = int(every)
        self.watch = None if watch is None else list(watch)
        self._prepared_for = None
        self._files: RunFiles | None = None
        self._board = None
        self._stack = contextlib.ExitStack()
        self._skipped = 0
        self._nonfinite_steps = 0
        self._last: dict[str, Any] = {}
        self._shown = None  # the (loss scale, skipped steps) TensorBoard holds last
        self._next_step = 0
        self._functions = None
        self._claimed: RunFiles | None = None  # the locked run directory, from set_model to close
        self._fit_open = False  # on_train_begin ran and on_train_end has not: a fit is (or was) under way
        self._built = False  # the fit prepared for has built its train function (`_make_train_function`)
        self._finished = False  # a fit ended with on_train_end: one callback records one fit

    # -- preparation (before fit builds its train function) ---------------------------------
    def set_model(self, model):
        """Everything is checked, and the directory claimed and locked, before anything is
        written or the model touched; a failure leaves neither the lock nor a wrapper."""
        super().set_model(model)
        if self._fit_open:  # this callback's earlier fit was interrupted: it is not resumed, but refused below
            self.close()
        if self._finished or getattr(model, "optimizer", None) is None or self._prepared_for is model:
            return  # a finished callback is inert (an evaluate after the fit); a new fit with it is refused
        _release_or_refuse(model, self)
        with _closed_on_failure(self):
            self._prepare(model)  # every check, and the shadow: neither the model nor the disk is touched
            self._claim()
            self._wrap(model)

    def _claim(self):
        """Lock the directory for this callback's fit (`RunFiles.locked`: a directory of a user's
        files, a link among its names or another run's lock is refused, untouched)."""
        if (self.directory / "header.json").exists():
            raise InvalidArgument(f"directory {str(self.directory)!r} holds a recorded run already; nothing was "
                                  f"changed: give UnderflowTelemetry a new or empty directory")
        files = RunFiles(self.directory, argument="directory")
        self._stack.enter_context(files.locked())
        self._claimed = files

    def _prepare(self, model):
        self._replicas = model.distribute_strategy.num_replicas_in_sync
        self._per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        if self._replicas > 1 and not (type(model).train_step is keras.Model.train_step and one_output(model)):
            raise InvalidArgument(f"UnderflowTelemetry under a strategy of {self._replicas} replicas needs Keras's own "
                                  "train_step and one model output; received a custom train_step or several outputs")
        if self._replicas > 1 and self._per_execution != 1:  # its train function is chosen before each step
            raise InvalidArgument(f"steps_per_execution must be 1 under a strategy of {self._replicas} replicas "
                                  f"(any value with one replica); received steps_per_execution={self._per_execution}")
        with model.distribute_strategy.scope():  # the clones and result variables live where the model does
            self._build(model)

    def _build(self, model):
        layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
        names = [layer.name for layer in layers]
        if self.watch is None:
            watched = layers
        else:
            unknown = [w for w in self.watch if not any(fnmatch.fnmatchcase(n, w) for n in names)]
            if unknown:
                raise InvalidArgument(f"watch must name layers of the model; received {unknown[0]!r}; "
                                      f"layers: {', '.join(names)}")
            watched = [layer for layer in layers if any(fnmatch.fnmatchcase(layer.name, w) for w in self.watch)]
        policy = model.dtype_policy
        self.format = format_of_dtype(np.dtype(policy.compute_dtype))
        self.thresholds = Thresholds.of(self.format)
        # Keras's own step with one output: measured inside the step itself (the update's own
        # gradients); otherwise (a custom train_step, several outputs) on a clone in the model's policy.
        self._own_step = type(model).train_step is keras.Model.train_step and one_output(model)
        self.shadow = copy_model(model, "float32")
        self.low = None if self._own_step else copy_model(model, None)
        watched_ids = {id(layer) for layer in watched}
        variables = model.trainable_variables
        owner = {}
        for layer in layers:
            for v in layer.trainable_variables:
                owner.setdefault(id(v), layer)
        self._weight_index = [i for i, v in enumerate(variables) if id(owner.get(id(v))) in watched_ids]
        # a subclassed model's layer outputs are not symbolic: its weights are measured, not its outputs
        self._tap_names = [layer.name for layer in watched if functional(model) and single_output(layer)]
        source = model if self._own_step else self.low  # a model over the user's own layers changes nothing in them
        self.low_forward = forward_with_taps(source, self._tap_names)
        self.shadow_forward = forward_with_taps(self.shadow, self._tap_names)
        for clone in (c for c in (self.low, self.shadow) if c is not None):
            clone.compile(loss=model.loss)  # the user's loss, on each clone's own predictions
        weight_names = [variables[i].path for i in self._weight_index]
        fp32_layer = [type(owner[id(variables[i])]).__name__ in _FP32_LAYERS or
                      owner[id(variables[i])].compute_dtype == "float32" for i in self._weight_index]
        precision = ["fp32" if f else self.format.name for f in fp32_layer] + \
            [format_of_dtype(np.dtype(model.get_layer(n).output.dtype)).name for n in self._tap_names]
        self.names = TensorNames(weight_names, self._tap_names, precision, [""] * len(precision))
        self.backward = backward_order(model, [variables[i] for i in self._weight_index], self._tap_names)
        count = len(self._weight_index) + len(self._tap_names)
        if count == 0:
            raise InvalidArgument("watch selects no trainable weight and no layer output; nothing to measure")

        def var(shape, dtype, value=0):
            # every replica holds the same value (summed over replicas before it is assigned)
            return tf.Variable(tf.fill(shape, tf.constant(value, dtype)), trainable=False,
                               synchronization=tf.VariableSynchronization.ON_WRITE,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        self._counter = var([], tf.int64)
        self._recorded = var([], tf.int64, -1)  # the step of the last measurement
        # One slot per step of an execution (step % steps_per_execution: an execution's steps are
        # consecutive), flushed when Keras calls on_train_batch_end once for the execution.
        # Each step's row of _STATUS (step -1: never written); a measured step's statistics.
        slots = self._per_execution
        self._status = var([slots, len(_STATUS)], tf.float64, -1)
        self._v = {"counts": var([slots, count, len(COUNT_FIELDS)], tf.int32),
                   "extremes": var([slots, count, 2], tf.float32),
                   "hist_low": var([slots, count, N_BINS], tf.int32),
                   "hist_shadow": var([slots, count, N_BINS], tf.int32),
                   "counterfactual": var([slots, count, len(COUNTERFACTUAL_FIELDS)], tf.int32),
                   "nonfinite": var([slots, count], tf.int32)}
        # On the host (no XLA in the user's step, no GPU) the tables are counted by one compiled
        # loop; otherwise under XLA, the user's step or not: its scatter-adds run about twice as
        # fast compiled as TensorFlow's kernels (measured on CPU).
        host = use_host_tables(model.jit_compile is True)
        self._statistics = tf.function(lambda lows, shadows: _with_nonfinite(
            batched_stats(lows, shadows, self.thresholds, host=host)), jit_compile=not host)

    def _wrap(self, model):
        """The model's step measures from now until `close`."""
        self._prepared_for = model
        self._original_step = model.train_step
        model.train_step = self._own_train_step if self._own_step else self._train_step
        model.make_train_function = self._make_train_function
        model.train_function = None  # rebuilt by fit around the wrapped step
        self._built = False

    def _make_train_function(self, force=False):
        """Keras's own `make_train_function`, which `fit` calls once, before `on_train_begin`. A
        second call while this callback's fit never began, or any call after it began and never
        ended, comes from a later fit: the earlier one was interrupted, so the model is restored
        first and the later fit trains as the user's model does."""
        model = self._prepared_for
        if self._fit_open or self._built:
            self.close()
        else:
            self._built = True
        return type(model).make_train_function(model, force)

    # -- the compiled part ---------------------------------------------------------------------
    def _scale(self):
        return tf.cast(self.model.optimizer.scale_loss(tf.constant(1.0, tf.float32)), tf.float32)

    def _inner_iterations(self):
        optimizer = self.model.optimizer
        return getattr(optimizer, "inner_optimizer", optimizer).iterations

    def _gradients(self, clone, forward, x, y, sample_weight, scale):
        """A clone's gradients of the scaled loss: the watched weights', then the taps'."""
        with tf.GradientTape() as tape:
            y_pred, taps = forward(x, training=True)
            loss = clone.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            scaled = tf.cast(loss, tf.float32) * scale
        targets = [clone.trainable_variables[i] for i in self._weight_index] + taps
        return zeros_for_none(tape.gradient(scaled, targets), targets)

    def _copy_weights(self, clone):
        def copy(*_):
            for target, source in zip(clone.weights, self.model.weights):
                target.assign(tf.cast(source, target.dtype))

        context = tf.distribute.get_replica_context()
        if self._replicas > 1 and context is not None:  # a mirrored variable is assigned across replicas
            context.merge_call(copy)
        else:
            copy()

    def _measure(self, lows, x, y, sample_weight, step, scale):
        """Classify `lows` (None: the low-precision clone's) against the fp32 shadow's gradients
        at the model's current weights, into the step's slot of the result variables."""
        if lows is None:
            self._copy_weights(self.low)
            lows = self._gradients(self.low, self.low_forward, x, y, sample_weight, scale)
        self._copy_weights(self.shadow)
        shadows = self._gradients(self.shadow, self.shadow_forward, x, y, sample_weight, scale)
        (counts, extremes, hist_low, hist_shadow, counterfactual), nonfinite = self._statistics(lows, shadows)
        context = tf.distribute.get_replica_context()
        if self._replicas > 1 and context is not None:  # pooled over replicas, as convprobe train does
            counts, hist_low, hist_shadow, counterfactual, nonfinite = (
                context.all_reduce(tf.distribute.ReduceOp.SUM, t)
                for t in (counts, hist_low, hist_shadow, counterfactual, nonfinite))
            every = context.all_gather(extremes[None], axis=0)
            extremes = tf.stack([tf.reduce_min(every[..., 0], axis=0), tf.reduce_max(every[..., 1], axis=0)], axis=-1)
        results = {"counts": counts, "extremes": extremes, "hist_low": hist_low, "hist_shadow": hist_shadow,
                   "counterfactual": counterfactual, "nonfinite": nonfinite}
        for key, value in results.items():
            self._put(self._v[key], step, value)
        self._recorded.assign(step)
        return tf.constant(True)

    def _put(self, variable, step, value):
        """Write `value` into `step`'s slot of a buffer variable (a whole assignment: it holds on
        every replica and under XLA)."""
        slot = tf.reshape(step % self._per_execution, [1, 1])
        variable.assign(tf.tensor_scatter_nd_update(variable, slot, value[None]))

    def _finish_step(self, step, scale, skipped, x, logs):
        """Count the step and write its row of _STATUS."""
        self._counter.assign_add(1)
        row = (step, scale, skipped, tf.equal(self._recorded, step), _batch_size(x),
               _log_value(logs, "loss"), _log_value(logs, *_ACCURACY))
        self._put(self._status, step, tf.stack([tf.cast(v, tf.float64) for v in row]))

    def _own_train_step(self, data, measure: bool | None = None):
        """Keras's own `train_step` (TensorFlow backend, Keras 3.15), with the watched layers'
        outputs among the tape's targets: a measured step classifies the very gradients its
        update applies (measured before the update; after it when a LossScaleOptimizer skips).
        `measure` True or False decides in Python instead of a `tf.cond` (`_chosen_functions`)."""
        model = self.model
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        step = self._counter.read_value()
        scale = self._scale()
        with tf.GradientTape() as tape:
            y_pred, taps = self.low_forward(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            model._loss_tracker.update_state(loss_module.unscale_loss_for_distribution(loss),
                                             sample_weight=_batch_size(x))
            scaled = model.optimizer.scale_loss(loss)
        weights = model.trainable_weights
        grads = tape.gradient(scaled, list(weights) + taps)
        wgrads = grads[: len(weights)]
        targets = [weights[i] for i in self._weight_index] + taps
        lows = zeros_for_none([wgrads[i] for i in self._weight_index] + list(grads[len(weights):]), targets)
        due = self._measure_before(measure, step, lambda: self._measure(lows, x, y, sample_weight, step, scale))
        before = tf.identity(self._inner_iterations())
        model.optimizer.apply_gradients(zip(wgrads, weights))
        skipped = tf.equal(self._inner_iterations(), before) if self._skips else tf.constant(False)
        self._measure_skip(measure, due, skipped, lambda: self._measure(lows, x, y, sample_weight, step, scale))
        logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        self._finish_step(step, scale, skipped, x, logs)
        return logs

    def _train_step(self, data, measure: bool | None = None):
        """The user's own step (a custom `train_step`, or several outputs), with a measurement on
        the low-precision clone before it on every `every`-th step and after it on a step whose
        update was skipped (weights unchanged, scale as the step used it); `measure` as for
        `_own_train_step`."""
        step = self._counter.read_value()
        scale = self._scale()
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        due = self._measure_before(measure, step, lambda: self._measure(None, x, y, sample_weight, step, scale))
        before = tf.identity(self._inner_iterations()) if self._skips else None
        logs = self._original_step(data)
        if self._skips:
            skipped = tf.equal(self._inner_iterations(), before)
            self._measure_skip(measure, due, skipped, lambda: self._measure(None, x, y, sample_weight, step, scale))
        else:
            skipped = tf.constant(False)
        self._finish_step(step, scale, skipped, x, logs)
        return logs

    def _measure_before(self, measure, step, run):
        """Measure before the update when the step is due (`measure` None: a `tf.cond` on the
        step counter) or when told to (True); returns whether it did."""
        if measure is None:
            due = tf.equal(step % self.every, 0)
            tf.cond(due, run, lambda: tf.constant(False))
            return due
        if measure:
            run()
        return tf.constant(measure)

    def _measure_skip(self, measure, due, skipped, run):
        """Measure after an update a LossScaleOptimizer skipped, unless measured before it; not
        with several replicas (their weight copies and sums cannot sit inside a `tf.cond`)."""
        if self._replicas == 1 and measure is not True:
            tf.cond(tf.logical_and(skipped, tf.logical_not(due)), run, lambda: tf.constant(False))

    @property
    def _skips(self) -> bool:
        return isinstance(self.model.optimizer, keras.optimizers.LossScaleOptimizer)

    # -- records (Python, between steps) -----------------------------------------------------------
    def on_train_begin(self, logs=None):
        if self._finished:
            raise InvalidArgument(f"this UnderflowTelemetry recorded a fit in {str(self.directory)!r} already; "
                                  f"give each fit its own UnderflowTelemetry and directory")
        if self._prepared_for is not self.model:  # closed since set_model (an earlier fit stopped early)
            self.set_model(self.model)
        with _closed_on_failure(self):
            if self.model.train_function is None:  # wrapped after fit built its train function
                type(self.model).make_train_function(self.model)
                self._built = True
            self._fit_open = True
            self._open()
            self._next_step = int(self._counter.numpy())
            self._functions = self._chosen_functions()

    def _chosen_functions(self):
        """Two train functions, one that measures and one that does not, chosen before each step
        (fit reads the attribute), or None where a `tf.cond` in one function decides. Chosen:
        under several replicas (their weight copies and sums cannot sit inside control flow),
        and under XLA with steps_per_execution 1 (on a CPU, XLA ran the benchmark model's
        measurement inside a conditional in 682 ms of CPU time, and outside one in 54 ms)."""
        model = self.model
        if not (self._replicas > 1 or (model.jit_compile is True and self._per_execution == 1)):
            return None
        step, functions = model.train_step, {}
        for measure in (False, True):
            model.train_step = functools.partial(step, measure=measure)
            type(model).make_train_function(model, force=True)  # Keras's own: not a later fit's call
            functions[measure] = model.train_function
        model.train_step = step
        return functions

    def _open(self):
        """The header, the CSVs and the event files: the first files written, at the fit's start."""
        files = self._claimed
        assert files is not None, "set_model claims the directory before the fit begins"
        params = self.params or {}
        planned = (params.get("epochs") or 0) * (params.get("steps") or 0)
        optimizer = self.model.optimizer
        dynamic = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        factor = getattr(optimizer, "loss_scale_factor", None)
        mode = "dynamic" if dynamic else ("static-no-skip" if factor else "none")
        config = {
            "source": "keras-callback", "model": self.model.name, "dtype": self.format.name,
            "policy": self.model.dtype_policy.name, "steps": int(planned),
            "loss_scale": {"mode": mode, "scale": float(self._scale().numpy())},
            "optimizer": type(optimizer).__name__, "every": self.every, "watch": self.watch,
        }
        files.start(ResumePlan(0, []), config_json=config, seed=None, device="keras fit", runtime={},
                    layer_names={"weight": list(self.names.weights), "activation": list(self.names.activations)})
        self._files = files
        self._board = TensorBoardWriter(files.tensorboard_path, self.format)

    def on_test_begin(self, logs=None):
        self._unused()

    def on_predict_begin(self, logs=None):
        self._unused()

    def _unused(self):
        """Keras sets a callback's model for evaluate and predict too: outside a fit, this one
        lets go of the directory and the model's step at once (inside a fit's validation,
        nothing changes)."""
        if not self._fit_open:
            self.close()

    def on_train_batch_begin(self, batch, logs=None):
        if self._functions is not None:
            self.model.train_function = self._functions[self._next_step % self.every == 0]
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        """Record the steps of the execution that ended (one, or up to steps_per_execution) from
        the buffers, its time shared evenly among them; Keras's `logs` are its last step's."""
        with _closed_on_failure(self):
            self._record_execution(logs)

    def _record_execution(self, logs):
        seconds = time.perf_counter() - self._started
        status = self._status.numpy()  # the one read from the device per execution
        steps = sorted((dict(zip(_STATUS, r)) for r in status if r[0] >= self._next_step), key=lambda r: r["step"])
        stats = {key: v.numpy() for key, v in self._v.items()} if any(r["measured"] for r in steps) else None
        logs = logs or {}
        for record in steps[:-1]:
            accuracy = "" if math.isnan(record["accuracy"]) else float(record["accuracy"])
            self._record(record, float(record["loss"]), accuracy, seconds / len(steps), stats)
        # the last step's from Keras's logs: under a strategy, reduced over replicas
        accuracy = next((logs[k] for k in _ACCURACY if k in logs), "")
        self._record(steps[-1], float(logs.get("loss", math.nan)), accuracy, seconds / len(steps), stats)

    def _record(self, status, loss, accuracy, seconds, stats):
        """Write one step's records: steps.csv, telemetry.csv when measured, TensorBoard."""
        step, scale, skipped, recorded = (int(status["step"]), float(status["loss_scale"]), bool(status["skipped"]),
                                          bool(status["measured"]))
        images = int(status["batch"])
        self._skipped += int(skipped)
        self._next_step = step + 1
        row = {"step": step, "loss": loss, "accuracy": accuracy,
               "loss_scale": scale, "finite": (not skipped) if self._skips else "",
               "skipped": skipped, "telemetry": recorded, "step_seconds": seconds,
               "images_per_second": images / seconds if seconds > 0 else math.inf,
               "nonfinite_tensors": "", "first_nonfinite": ""}
        rows = None
        if recorded:
            slot = {key: value[step % self._per_execution] for key, value in stats.items()}
            slot["min_abs"], slot["max_abs"] = slot["extremes"][:, 0], slot["extremes"][:, 1]
            rows = telemetry_rows(step, scale, self.names, slot)
            row.update(nonfinite_fields(self.names, slot["nonfinite"], self.backward))
            if not self._skips:
                row["finite"] = not row["nonfinite_tensors"]
        if row["nonfinite_tensors"] or skipped:
            self._nonfinite_steps += 1
        self._files.write_step({c: row[c] for c in STEP_COLUMNS})
        shown = (scale, self._skipped)
        if recorded or shown != self._shown:  # TensorBoard: at each change and each measured step
            self._board.write_step(step, scale, self._skipped)
            self._shown = shown
        if rows is not None:
            self._files.write_telemetry(rows)
            self._board.write_records(step, rows)
        self._last = row

    def close(self) -> None:
        """Close the records, release the directory's lock and restore the model's own step and
        train function, each whatever the one before raised: what `on_train_end` does after the
        summary, and what a fit that never reached it needs. Called by this callback when one of
        its own hooks fails, by `__exit__`, and at the model's next fit or callback."""
        board, files_, model = self._board, self._claimed, self._prepared_for
        self._files = self._board = self._prepared_for = self._claimed = None
        self._fit_open = self._built = False
        # a directory no record was written to is left as it was found: no lock file, no new folder
        written = files_ is not None and files_.header_path.exists()
        unused = (InvalidArgument, InvalidArgument("closed before its fit wrote a record"), None)
        try:
            if board is not None:
                board.close()
        finally:
            try:
                if files_ is not None:
                    files_.close()
            finally:
                try:
                    self._stack.__exit__(*((None, None, None) if written else unused))  # the lock
                    self._stack = contextlib.ExitStack()
                finally:
                    if model is not None:
                        for name in ("train_step", "make_train_function"):
                            model.__dict__.pop(name, None)
                        model.train_function = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        """`with UnderflowTelemetry(...) as telemetry: model.fit(..., callbacks=[telemetry])`: the
        model is restored and the lock released when the block ends, however it ends."""
        self.close()

    def on_train_end(self, logs=None):
        model = self.model
        try:
            if self._files is not None:
                self._finished = True
                last = self._last
                self._files.finish({
                    "finished": True, "final_step": int(self._counter.numpy()),
                    "skipped_steps": self._skipped, "nonfinite_steps": self._nonfinite_steps,
                    "final_loss_scale": last.get("loss_scale"), "final_loss": last.get("loss"),
                    "eval_accuracy": None, "median_images_per_second": None, "jit": model.jit_compile is True,
                })
        finally:
            self.close()  # the wrapped step goes; fit rebuilds the user's own next time


def _batch_size(x):
    """The number of samples in a batch's inputs."""
    return tf.shape(next(i for i in tree.flatten(x) if i is not None))[0]


def _log_value(logs, *keys):
    """The first of `keys` that a step's logs hold as a scalar, as float64; NaN when none does."""
    for key in keys:
        value = logs.get(key) if isinstance(logs, dict) else None
        if value is not None and tf.convert_to_tensor(value).shape.rank == 0:
            return tf.cast(value, tf.float64)
    return tf.constant(math.nan, tf.float64)


def _with_nonfinite(stats):
    """`batched_stats`' results and each tensor's non-finite count (its inf and nan counts)."""
    counts = stats[0]
    return stats, counts[:, COUNT_FIELDS.index("inf")] + counts[:, COUNT_FIELDS.index("nan")]


@contextlib.contextmanager
def _closed_on_failure(callback: UnderflowTelemetry):
    """Close `callback` (records, lock, the model's own step) when the block raises, then raise:
    Keras calls no callback after a hook fails, so nothing else would."""
    try:
        yield
    except BaseException:
        callback.close()
        raise


def _release_or_refuse(model, callback: UnderflowTelemetry) -> None:
    """The model's step may still be another callback's wrapper. That callback's fit began and
    never ended, or built its train function and never began: it was interrupted, and is
    closed. Otherwise it was prepared for this same fit (Keras sets every callback's model
    before building the train function): two callbacks cannot wrap one step, so this one is
    refused, and the other closed, before either writes anything."""
    step = model.__dict__.get("train_step")
    other = getattr(getattr(step, "func", step), "__self__", None)
    if not isinstance(other, UnderflowTelemetry) or other is callback:
        return
    interrupted = other._fit_open or model.train_function is not None
    other.close()
    if not interrupted:
        raise InvalidArgument(f"this fit has two UnderflowTelemetry callbacks (directories {str(other.directory)!r} "
                              f"and {str(callback.directory)!r}), or one whose earlier fit stopped before it "
                              f"began; nothing was written: give a fit one UnderflowTelemetry")
