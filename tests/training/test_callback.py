"""`UnderflowTelemetry` on a user's own Keras model (not convprobe's ResNet): its records are
`convprobe train`'s, `report` and the assertions read them, TensorBoard gets per-layer tags,
a skipped step names its overflowing tensors, and the user's training is left exactly as it was."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

from convprobe import cli
from convprobe.errors import InvalidArgument
from convprobe.formats import FP16
from convprobe.testing import assert_no_gradient_underflow
from convprobe.training.records import STEP_COLUMNS, TELEMETRY_COLUMNS
from convprobe.training.telemetry import Thresholds, numpy_tensor_stats

from .read_back import events, rows as read_rows

BATCH = 8


def _model(scale: float | None = 2.0**15, steps_per_execution: int = 1, jit_compile: bool = False):
    """Conv2D, BatchNormalization, Dense under mixed_float16 (logits in fp32), compiled with a
    LossScaleOptimizer at `scale` (None: plain SGD, no loss scaling)."""
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((8, 8, 3))
        h = keras.layers.Conv2D(4, 3, padding="same", name="conv")(x)
        h = keras.layers.BatchNormalization(name="bn")(h)
        h = keras.layers.ReLU(name="relu")(h)
        h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
        h = keras.layers.Dense(10, name="dense")(h)
        y = keras.layers.Activation("linear", dtype="float32", name="logits")(h)
        model = keras.Model(x, y)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    sgd = keras.optimizers.SGD(0.01)
    optimizer = sgd if scale is None else keras.optimizers.LossScaleOptimizer(sgd, initial_scale=scale)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit_compile, steps_per_execution=steps_per_execution)
    return model


def _data(scale_inputs: float = 1.0):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(6 * BATCH, 8, 8, 3)) * scale_inputs).astype("float32"), rng.integers(0, 10, 6 * BATCH)




@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The issue's must-show: 6 steps with callbacks=[UnderflowTelemetry(dir, every=2)], and the
    same fit without the callback."""
    from convprobe.training import UnderflowTelemetry

    out = tmp_path_factory.mktemp("cb") / "tb"
    xs, ys = _data()
    model = _model()
    first = [w.copy() for w in model.get_weights()]
    history = model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                        callbacks=[UnderflowTelemetry(out, every=2)])
    plain = _model()
    plain_history = plain.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    assert history.history == plain_history.history  # the same loss and accuracy, bit for bit
    return out, model, plain, first


def test_the_callback_leaves_the_user_s_training_bit_for_bit_as_it_was(fitted):
    _, model, plain, _ = fitted
    for a, b in zip(model.get_weights(), plain.get_weights()):  # moving statistics included
        assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    assert "train_step" not in model.__dict__  # the wrapped step is gone after fit


def test_records_are_convprobe_train_s_and_report_reads_them(fitted, tmp_path, capsys):
    out, _, _, _ = fitted
    steps, telemetry = read_rows(out / "steps.csv"), read_rows(out / "telemetry.csv")
    assert list(steps[0]) == list(STEP_COLUMNS) and list(telemetry[0]) == list(TELEMETRY_COLUMNS)
    assert [r["telemetry"] for r in steps] == ["True", "False"] * 3
    assert all(float(r["images_per_second"]) > 0 for r in steps)
    assert [r["skipped"] for r in steps] == ["False"] * 6 and [r["finite"] for r in steps] == ["True"] * 6
    assert sorted({int(r["step"]) for r in telemetry}) == [0, 2, 4]
    layers = {(r["kind"], r["layer"]) for r in telemetry}
    assert {("weight", "conv/kernel"), ("weight", "bn/gamma"), ("weight", "dense/kernel"),
            ("activation", "conv"), ("activation", "bn"), ("activation", "dense")} <= layers
    precision = {r["layer"]: r["precision"] for r in telemetry if r["kind"] == "weight"}
    assert precision["bn/gamma"] == "fp32" and precision["conv/kernel"] == "fp16"
    assert all(float(r["loss_scale"]) == 2.0**15 for r in telemetry)
    assert cli.main(["report", str(out), "--out-dir", str(tmp_path), "--formats", "png"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "tb-run.png")]
    assert_no_gradient_underflow(out, kind="weight", layer="bn/*")  # fp32 parameters cannot flush


def test_tensorboard_has_per_layer_scalars_and_log2_histograms(fitted):
    out, _, _, _ = fitted
    tags = events(out)
    for layer in ("weight/conv/kernel", "activation/bn", "activation/dense"):
        for field in ("flushed_fraction", "lost_fraction", "subnormal_fraction"):
            seen = tags[f"underflow/{layer}/{field}"]
            assert [step for step, _, _ in seen] == [0, 2, 4] and {p for _, p, _ in seen} == {"scalars"}
        histograms = tags[f"log2_abs_grad/{layer}"]
        assert {p for _, p, _ in histograms} == {"histograms"}
        table = histograms[0][2]  # rows of (left edge, right edge, count): one binade each
        assert table.shape[1] == 3 and np.all(table[:, 1] - table[:, 0] == 1) and table[:, 2].sum() > 0
    assert [s for s, _, _ in tags["loss_scale"]] == [0, 2, 4]  # measured steps and changes (none here)
    assert float(tags["loss_scale"][0][2]) == 2.0**15 and float(tags["skipped_steps"][-1][2]) == 0
    assert float(tags["format/log2_smallest_subnormal"][0][2]) == -24


def test_step_zero_counts_match_an_independent_numpy_classification(fitted):
    """The callback's step-0 counts of the weight gradients, recomputed here: the user's own
    fp16 model and an fp32 copy, same weights and batch, S = 2^15, classified in NumPy."""
    import keras

    out, _, _, first = fitted
    low = _model()
    low.set_weights(first)
    shadow = keras.Model.from_config(low.get_config())  # same layers ...
    for layer in shadow.layers:
        layer.dtype_policy = keras.DTypePolicy("float32")  # ... all in fp32
    shadow.set_weights(first)
    _assert_step_zero_counts(out, low, shadow)


def _assert_step_zero_counts(out, low, shadow):
    """The step-0 weight rows of `out`, in the order of `low`'s weights, are NumPy's classification
    of `low`'s gradients against `shadow`'s (same weights), on the first batch at S = 2^15."""
    import keras
    import tensorflow as tf

    xs, ys = _data()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    grads = []
    for model in (low, shadow):
        with tf.GradientTape() as tape:
            scaled = tf.cast(loss(ys[:BATCH], model(xs[:BATCH], training=True)), tf.float32) * 2.0**15
        grads.append([g.numpy() for g in tape.gradient(scaled, model.trainable_variables)])
    rows = [r for r in read_rows(out / "telemetry.csv") if r["step"] == "0" and r["kind"] == "weight"]
    assert len(rows) == len(low.trainable_variables)
    for row, g_low, g_shadow in zip(rows, *grads):
        expected = numpy_tensor_stats(g_low, g_shadow, Thresholds.of(FP16))
        assert {k: int(row[k]) for k in expected} == expected, row["layer"]


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_a_skipped_step_names_its_overflowing_tensors_first_in_backward_order(tmp_path, jit_compile):
    """S = 2^24: the logits' gradient S*(p - y)/8 reaches fp16 at the dense layer's output as inf;
    every step skips (the scale halves each time, still too large), recorded or not. Under XLA
    step 0 runs the train function that measures and steps 1 and 2 the one that does not,
    which measures a skipped step after it."""
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    model = _model(scale=2.0**24, jit_compile=jit_compile)
    model.fit(xs[: 3 * BATCH], ys[: 3 * BATCH], batch_size=BATCH, verbose=0, shuffle=False,
              callbacks=[UnderflowTelemetry(tmp_path / "run", every=4)])
    steps = read_rows(tmp_path / "run" / "steps.csv")
    assert [r["skipped"] for r in steps] == ["True"] * 3
    assert [float(r["loss_scale"]) for r in steps] == [2.0**24, 2.0**23, 2.0**22]
    assert [r["telemetry"] for r in steps] == ["True"] * 3  # a skipped step is measured after the skip
    for row in steps:
        named = row["nonfinite_tensors"].split(";")
        assert row["first_nonfinite"] == named[0] == "activation:dense"
        assert "weight:dense/kernel" in named and "activation:logits" not in named  # fp32 logits stay finite
    telemetry = read_rows(tmp_path / "run" / "telemetry.csv")
    dense = [r for r in telemetry if r["layer"] == "dense" and r["kind"] == "activation"]
    assert [int(r["inf"]) + int(r["nan"]) > 0 for r in dense] == [True] * 3


def test_without_loss_scaling_counterfactual_columns_are_written(tmp_path):
    """S = 1 (Keras wraps any optimizer of a mixed_float16 model in a LossScaleOptimizer: a
    scale of 1 is its "no scaling"): unscaled gradients flush in fp8 formats, never in bf16."""
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    model = _model(scale=1.0)
    model.fit(xs[:BATCH], ys[:BATCH], batch_size=BATCH, verbose=0,
              callbacks=[UnderflowTelemetry(tmp_path / "run", every=1, watch=["conv", "dense"])])
    telemetry = read_rows(tmp_path / "run" / "telemetry.csv")
    assert {r["layer"] for r in telemetry} == {"conv/kernel", "conv/bias", "dense/kernel", "dense/bias",
                                               "conv", "dense"}
    assert all(float(r["loss_scale"]) == 1.0 for r in telemetry)
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        assert max(float(r[f"{fmt}_flushed_fraction"]) for r in telemetry) > 0, fmt
    e4m3 = [float(r["fp8_e4m3_flushed_fraction"]) + float(r["fp8_e4m3_subnormal_fraction"]) for r in telemetry]
    e5m2 = [float(r["fp8_e5m2_flushed_fraction"]) + float(r["fp8_e5m2_subnormal_fraction"]) for r in telemetry]
    assert all(a >= b for a, b in zip(e4m3, e5m2))  # e4m3's range ends 6 binades above e5m2's
    for r in telemetry:  # bf16 has fp32's range: what fp32 holds, bf16 does not flush
        assert float(r["bf16_flushed_fraction"]) == 0


@pytest.mark.parametrize("jit_compile", [False, True], ids=["host-tables", "xla"])
def test_the_statistics_run_on_the_host_without_xla_and_under_xla_with_it(tmp_path, jit_compile):
    """A fit compiled by XLA keeps its statistics under XLA (a host call cannot sit in an XLA
    step); without XLA, on this CPU, the host loop counts them. Either way every watched
    tensor's elements are all classified at each measured step."""
    from convprobe.training import UnderflowTelemetry
    from convprobe.training.telemetry import use_host_tables

    assert use_host_tables(jit_compile) is (not jit_compile)
    xs, ys = _data()
    model = _model(jit_compile=jit_compile)
    model.fit(xs[:2 * BATCH], ys[:2 * BATCH], batch_size=BATCH, verbose=0,
              callbacks=[UnderflowTelemetry(tmp_path / "run", every=1, watch=["conv", "dense"])])
    telemetry = read_rows(tmp_path / "run" / "telemetry.csv")
    sizes = {"conv/kernel": 3 * 3 * 3 * 4, "conv/bias": 4, "dense/kernel": 4 * 10, "dense/bias": 10,
             "conv": BATCH * 8 * 8 * 4, "dense": BATCH * 10}
    assert sorted((r["step"], r["layer"]) for r in telemetry) == sorted((step, layer) for step in "01" for layer in sizes)
    for r in telemetry:
        assert int(r["n"]) == sizes[r["layer"]], r["layer"]
        classified = sum(int(r[k]) for k in ("routing_zero", "flushed", "lost", "subnormal", "inf", "nan"))
        assert classified <= int(r["n"]) and int(r["n"]) > 0


def test_under_xla_the_train_function_is_chosen_before_each_step_and_training_is_unchanged(tmp_path):
    """Under XLA (steps_per_execution 1) a measurement inside a conditional ran more than ten
    times slower, so the callback chooses, before each step, a train function that measures
    or one that does not: steps 0, 2, 4 are measured, the others not, every measured tensor
    is classified whole, and the fit's History and weights are those of the XLA fit without
    the callback, bit for bit."""
    import keras

    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    model = _model(jit_compile=True)
    callback = UnderflowTelemetry(tmp_path / "run", every=2, watch=["conv", "dense"])
    traced = []  # how each traced step decides whether to measure: True, False, or None (a tf.cond)
    decide = callback._measure_before
    callback._measure_before = lambda measure, *args: traced.append(measure) or decide(measure, *args)
    chosen = []
    spy = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: chosen.append(
        next(k for k, f in callback._functions.items() if f is model.train_function)))
    history = model.fit(xs, ys, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[callback, spy])
    plain = _model(jit_compile=True)
    plain_history = plain.fit(xs, ys, batch_size=BATCH, verbose=0, shuffle=False)
    assert chosen == [True, False] * 3
    assert sorted(set(traced)) == [False, True]  # no step traced with the measurement inside a tf.cond
    steps = read_rows(tmp_path / "run" / "steps.csv")
    assert [r["telemetry"] for r in steps] == ["True", "False"] * 3
    telemetry = read_rows(tmp_path / "run" / "telemetry.csv")
    assert sorted({r["step"] for r in telemetry}) == ["0", "2", "4"]
    sizes = {"conv/kernel": 3 * 3 * 3 * 4, "conv/bias": 4, "dense/kernel": 4 * 10, "dense/bias": 10,
             "conv": BATCH * 8 * 8 * 4, "dense": BATCH * 10}
    assert all(int(r["n"]) == sizes[r["layer"]] for r in telemetry)
    assert history.history == plain_history.history
    for a, b in zip(model.get_weights(), plain.get_weights()):
        assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_bad_arguments_and_a_user_s_directory_are_refused(tmp_path):
    from convprobe.training import UnderflowTelemetry

    with pytest.raises(InvalidArgument, match="every must be a positive integer"):
        UnderflowTelemetry(tmp_path / "a", every=0)
    with pytest.raises(InvalidArgument, match="watch must be None or a list"):
        UnderflowTelemetry(tmp_path / "a", watch=[3])
    xs, ys = _data()
    model = _model()
    with pytest.raises(InvalidArgument, match="watch must name layers of the model; received 'nope'"):
        model.fit(xs[:BATCH], ys[:BATCH], verbose=0, callbacks=[UnderflowTelemetry(tmp_path / "a", watch=["nope"])])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    model = _model()
    with pytest.raises(InvalidArgument, match=f"^directory {str(mine)!r} holds files that are not"):  # the keyword
        model.fit(xs[:BATCH], ys[:BATCH], verbose=0, callbacks=[UnderflowTelemetry(mine)])
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_steps_per_execution_records_every_step_as_one_step_per_execution_does(tmp_path):
    """6 steps, every=2: one step per execution, then 3 (two measured steps in one execution)
    and 4 (a short last execution of 2): the same records, the same training."""
    from convprobe.training import UnderflowTelemetry

    timing = ("step_seconds", "images_per_second")
    xs, ys = _data()
    runs = {}
    for per_execution in (1, 3, 4):
        model, out = _model(steps_per_execution=per_execution), tmp_path / str(per_execution)
        history = model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                            callbacks=[UnderflowTelemetry(out, every=2)])
        steps = [{k: v for k, v in r.items() if k not in timing} for r in read_rows(out / "steps.csv")]
        runs[per_execution] = steps, read_rows(out / "telemetry.csv"), model.get_weights(), history.history
    steps, telemetry, weights, history = runs[1]
    assert [r["step"] for r in steps] == [str(i) for i in range(6)]
    assert [r["telemetry"] for r in steps] == ["True", "False"] * 3
    assert len({r["loss"] for r in steps}) == 6  # each step's own running loss, not the execution's last
    assert sorted({int(r["step"]) for r in telemetry}) == [0, 2, 4]
    for per_execution in (3, 4):
        other_steps, other_telemetry, other_weights, other_history = runs[per_execution]
        assert other_steps == steps, per_execution
        assert other_telemetry == telemetry, per_execution
        assert other_history == history, per_execution
        for a, b in zip(other_weights, weights):
            assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@functools.cache
def _net_classes():
    """A subclassed model (conv, pool, dense, fp32 logits) that Keras rebuilds from its
    constructor's defaults, and one it cannot rebuild."""
    import keras

    class Net(keras.Model):
        def __init__(self, filters=4, classes=10, **kwargs):
            super().__init__(**kwargs)
            self.conv = keras.layers.Conv2D(filters, 3, padding="same", name="conv")
            self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
            self.dense = keras.layers.Dense(classes, name="dense")
            self.logits = keras.layers.Activation("linear", dtype="float32", name="logits")

        def call(self, x):
            return self.logits(self.dense(self.pool(self.conv(x))))

    class Sized(Net):
        """A required constructor argument and no get_config: Keras has no config to rebuild it from."""

        def __init__(self, filters, **kwargs):
            super().__init__(filters=filters, **kwargs)

    return Net, Sized


def _subclassed(*args, rebuildable=True, built=True):
    """`_net_classes`' model (`args` to its constructor) under mixed_float16, built (called) on the
    data's shape unless `built` is False, compiled as `_model` is."""
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _net_classes()[0 if rebuildable else 1](*args)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if built:
        model(_data()[0][:1])
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**15),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=False)
    return model


def test_a_subclassed_model_is_measured_against_a_rebuilt_fp32_shadow_and_trains_as_without(tmp_path):
    """Its fp32 shadow is `from_config(get_config())` under float32: the step-0 counts are NumPy's
    classification against such a copy, weights only (no symbolic layer outputs to tap); the
    training is bit for bit the same as without the callback."""
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    model, plain = _subclassed(), _subclassed()
    first = [w.copy() for w in model.get_weights()]
    callback = UnderflowTelemetry(tmp_path / "run", every=2)
    history = model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    assert {layer.compute_dtype for layer in callback.shadow._flatten_layers()} == {"float32"}
    assert type(callback.shadow) is type(model) and len(callback.shadow.weights) == len(model.weights)
    plain_history = plain.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    assert history.history == plain_history.history
    for a, b in zip(model.get_weights(), plain.get_weights()):
        assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    assert "train_step" not in model.__dict__
    steps, telemetry = read_rows(tmp_path / "run" / "steps.csv"), read_rows(tmp_path / "run" / "telemetry.csv")
    assert [r["telemetry"] for r in steps] == ["True", "False"] * 3
    assert sorted({int(r["step"]) for r in telemetry}) == [0, 2, 4]
    assert {r["kind"] for r in telemetry} == {"weight"}
    precision = {r["layer"]: r["precision"] for r in telemetry}
    assert precision == {"net/conv/kernel": "fp16", "net/conv/bias": "fp16",
                         "net/dense/kernel": "fp16", "net/dense/bias": "fp16"}
    low = _subclassed()
    low.set_weights(first)
    shadow = type(low).from_config({**low.get_config(), "dtype": "float32"})  # global policy: float32
    shadow(xs[:1])
    shadow.set_weights(first)
    assert {layer.compute_dtype for layer in shadow._flatten_layers()} == {"float32"}
    _assert_step_zero_counts(tmp_path / "run", low, shadow)


def test_a_subclassed_model_that_cannot_be_rebuilt_is_refused_in_one_line(tmp_path):
    """Without get_config, Keras rebuilds a subclassed model from its constructor's defaults: a
    required argument fails, and filters=8 would come back with 4 (other weights): both refused,
    as is a model not yet built (no input shapes to build the shadow on)."""
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    for model, reason in ((_subclassed(8, rebuildable=False), "whose rebuild raised NotImplementedError: Object "
                           "Sized was created by passing non-serializable argument values"),
                          (_subclassed(8), "rebuilt from its config must have the model's weights"),
                          (_subclassed(built=False), "must be built before fit, by calling it on a batch")):
        with pytest.raises(InvalidArgument) as refused:
            model.fit(xs[:BATCH], ys[:BATCH], batch_size=BATCH, verbose=0,
                      callbacks=[UnderflowTelemetry(tmp_path / "run")])
        message = str(refused.value)
        assert "\n" not in message and reason in message
        assert message.startswith("a subclassed model")
        assert not (tmp_path / "run").exists()  # refused before anything is written
        assert "train_step" not in model.__dict__


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_a_model_with_two_outputs_is_measured_on_a_clone_and_trains_as_without(tmp_path, jit_compile):
    """Keras's own step is replaced only for one output; otherwise the user's step runs and a
    clone in the model's policy gives the low-precision gradients (under XLA, in the train
    function chosen for a measured step)."""
    import keras

    from convprobe.training import UnderflowTelemetry

    def build():
        keras.utils.set_random_seed(0)
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            x = keras.Input((8, 8, 3))
            h = keras.layers.GlobalAveragePooling2D(name="pool")(keras.layers.Conv2D(4, 3, name="conv")(x))
            a = keras.layers.Activation("linear", dtype="float32", name="a")(keras.layers.Dense(10, name="da")(h))
            b = keras.layers.Activation("linear", dtype="float32", name="b")(keras.layers.Dense(10, name="db")(h))
            model = keras.Model(x, [a, b])
        finally:
            keras.mixed_precision.set_global_policy("float32")
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)), loss=[loss, loss],
                      jit_compile=jit_compile)
        return model

    xs, ys = _data()
    model, plain = build(), build()
    model.fit(xs[: 3 * BATCH], [ys[: 3 * BATCH]] * 2, batch_size=BATCH, verbose=0, shuffle=False,
              callbacks=[UnderflowTelemetry(tmp_path / "run", every=2)])
    plain.fit(xs[: 3 * BATCH], [ys[: 3 * BATCH]] * 2, batch_size=BATCH, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), plain.get_weights()):
        assert np.array_equal(a, b)
    telemetry = read_rows(tmp_path / "run" / "telemetry.csv")
    assert sorted({int(r["step"]) for r in telemetry}) == [0, 2]
    assert {"conv/kernel", "da/kernel", "db/kernel", "conv", "da", "db"} <= {r["layer"] for r in telemetry}
    assert all(int(r["n"]) > 0 for r in telemetry)


def test_after_a_fit_that_raised_a_new_callback_does_not_stack_on_the_old_wrapper(tmp_path):
    import keras

    from convprobe.training import UnderflowTelemetry

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("stopped by the user's callback")

    xs, ys = _data()
    model = _model()
    with pytest.raises(RuntimeError, match="stopped by the user's callback"):
        model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0,
                  callbacks=[UnderflowTelemetry(tmp_path / "first", every=1), Stop()])
    model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0,
              callbacks=[UnderflowTelemetry(tmp_path / "second", every=1)])
    assert "train_step" not in model.__dict__
    assert [r["step"] for r in read_rows(tmp_path / "second" / "steps.csv")] == ["0", "1"]  # each callback counts its own
    assert len(read_rows(tmp_path / "first" / "telemetry.csv")) == 12  # step 0 only: the old wrapper is gone



def _own(model) -> bool:
    """Whether the model trains with its own step and builds its own train function again."""
    return "train_step" not in model.__dict__ and "make_train_function" not in model.__dict__


def test_a_fit_interrupted_by_ctrl_c_restores_the_model_at_its_next_fit_and_frees_the_directory(tmp_path):
    import keras

    from convprobe import files
    from convprobe.training import UnderflowTelemetry

    class Interrupt(keras.callbacks.Callback):  # Ctrl-C between two steps, where no callback hook runs after
        def on_train_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt

    xs, ys = _data()
    model = _model()
    first = UnderflowTelemetry(tmp_path / "first", every=1)
    with pytest.raises(KeyboardInterrupt):
        model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0, callbacks=[first, Interrupt()])
    assert files.lock_holder(tmp_path / "first") is not None  # held until convprobe runs again
    weights = [w.copy() for w in model.get_weights()]
    model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0, shuffle=False)  # a plain fit
    assert _own(model) and files.lock_holder(tmp_path / "first") is None
    assert int(first._counter.numpy()) == 1  # the wrapper of the interrupted fit measured none of the plain steps
    assert not any(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()) if a.size > 1)  # it trained

    history = model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0,
                        callbacks=[UnderflowTelemetry(tmp_path / "fresh", every=1)])
    assert _own(model) and files.lock_holder(tmp_path / "fresh") is None
    assert [r["step"] for r in read_rows(tmp_path / "fresh" / "steps.csv")] == ["0", "1"]
    assert (tmp_path / "fresh" / "summary.json").is_file() and len(history.history["loss"]) == 1
    assert not (tmp_path / "first" / "summary.json").exists()  # interrupted: recorded as far as it went


def test_a_with_block_restores_the_model_and_the_lock_at_once(tmp_path):
    import keras

    from convprobe import files
    from convprobe.training import UnderflowTelemetry

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt

    xs, ys = _data()
    model = _model()
    with pytest.raises(KeyboardInterrupt), UnderflowTelemetry(tmp_path / "run", every=1) as telemetry:
        model.fit(xs[:BATCH], ys[:BATCH], batch_size=BATCH, verbose=0, callbacks=[telemetry, Interrupt()])
    assert _own(model) and model.train_function is None and files.lock_holder(tmp_path / "run") is None
    assert [r["step"] for r in read_rows(tmp_path / "run" / "steps.csv")] == ["0"]


def test_evaluate_and_predict_with_the_callback_leave_model_and_directory_alone(tmp_path):
    from convprobe import files
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    model = _model()
    telemetry = UnderflowTelemetry(tmp_path / "run", every=1)
    model.evaluate(xs[:BATCH], ys[:BATCH], verbose=0, callbacks=[telemetry])  # before any fit
    model.predict(xs[:BATCH], verbose=0, callbacks=[UnderflowTelemetry(tmp_path / "other")])
    assert _own(model) and not (tmp_path / "run").exists() and not (tmp_path / "other").exists()
    model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0, callbacks=[telemetry])
    assert [r["step"] for r in read_rows(tmp_path / "run" / "steps.csv")] == ["0", "1"]
    model.evaluate(xs[:BATCH], ys[:BATCH], verbose=0, callbacks=[telemetry])  # after it: inert
    assert _own(model) and files.lock_holder(tmp_path / "run") is None
    with pytest.raises(InvalidArgument, match="recorded a fit in .* already; give each fit its own"):
        model.fit(xs[:BATCH], ys[:BATCH], verbose=0, callbacks=[telemetry])
    assert _own(model)


def test_the_same_callbacks_again_after_a_fit_that_failed_before_it_began(tmp_path):
    import keras

    from convprobe.training import UnderflowTelemetry

    class FailsOnce(keras.callbacks.Callback):  # a callback before this one fails in on_train_begin
        failed = False

        def on_train_begin(self, logs=None):
            if not self.failed:
                FailsOnce.failed = True
                raise RuntimeError("the user's callback failed once")

    xs, ys = _data()
    model = _model()
    callbacks = [FailsOnce(), UnderflowTelemetry(tmp_path / "run", every=1)]
    with pytest.raises(RuntimeError, match="failed once"):
        model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0, callbacks=callbacks)
    model.fit(xs[: 2 * BATCH], ys[: 2 * BATCH], batch_size=BATCH, verbose=0, callbacks=callbacks)
    assert [r["step"] for r in read_rows(tmp_path / "run" / "steps.csv")] == ["0", "1"] and _own(model)
    assert (tmp_path / "run" / "summary.json").is_file()

def test_two_callbacks_in_one_fit_are_refused_before_either_writes(tmp_path):
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    model = _model()
    shared = tmp_path / "shared"
    with pytest.raises(InvalidArgument) as info:
        model.fit(xs[:BATCH], ys[:BATCH], verbose=0,
                  callbacks=[UnderflowTelemetry(shared), UnderflowTelemetry(shared)])
    assert str(info.value) == (f"this fit has two UnderflowTelemetry callbacks (directories {str(shared)!r} and "
                               f"{str(shared)!r}), or one whose earlier fit stopped before it began; nothing was "
                               f"written: give a fit one UnderflowTelemetry")
    assert not shared.exists() and _own(model)  # no lock file, no folder, the model's own step
    model.fit(xs[:BATCH], ys[:BATCH], batch_size=BATCH, verbose=0, callbacks=[UnderflowTelemetry(shared)])
    assert (shared / "summary.json").is_file() and _own(model)


def test_a_directory_in_use_by_another_fit_is_refused_naming_it_and_left_as_it_was(tmp_path):
    from convprobe import files
    from convprobe.training import UnderflowTelemetry

    xs, ys = _data()
    busy = tmp_path / "busy"
    with files.directory_lock(busy, what="convprobe run"):
        model = _model()
        with pytest.raises(InvalidArgument, match=f"directory {str(busy)!r} is in use by another convprobe run "
                                                  f"\\(pid {os.getpid()}\\)"):
            model.fit(xs[:BATCH], ys[:BATCH], verbose=0, callbacks=[UnderflowTelemetry(busy)])
        assert _own(model) and sorted(p.name for p in busy.iterdir()) == [files.LOCK_NAME]


DISK_FULL = r'''
import json, resource, signal
import numpy as np, keras
from convprobe import files
from convprobe.errors import OutputWriteFailed
from convprobe.training import UnderflowTelemetry
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, name="dense")])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
xs, ys = rng.normal(size=(64, 8, 8, 3)).astype("float32"), rng.integers(0, 10, 64)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full quota
resource.setrlimit(resource.RLIMIT_FSIZE, (30000, resource.RLIM_INFINITY))  # the CSVs fit, the events not
try:
    model.fit(xs, ys, batch_size=4, verbose=0, callbacks=[UnderflowTelemetry("run", every=1)])
    error = None
except OutputWriteFailed as failure:
    error = str(failure)
print("RESULT" + json.dumps({"error": error, "own": "train_step" not in model.__dict__,
                             "lock": files.lock_holder("run")}))
'''


def test_a_full_disk_under_the_callback_names_the_os_reason_and_frees_model_and_directory(tmp_path, run_python):
    proc = run_python(DISK_FULL, tmp_path)
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["error"] == "could not write TensorBoard events in 'run/tensorboard': File too large (EFBIG)", result
    assert result["own"] and result["lock"] is None, result


MIRRORED = r'''
import csv, json
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from convprobe.training import UnderflowTelemetry
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def build(steps_per_execution=1):
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        x = keras.Input((8, 8, 3))
        h = keras.layers.ReLU()(keras.layers.BatchNormalization(name="bn")(keras.layers.Conv2D(4, 3, padding="same", name="conv")(x)))
        h = keras.layers.Dense(10, name="dense")(keras.layers.GlobalAveragePooling2D()(h))
        model = keras.Model(x, keras.layers.Activation("linear", dtype="float32", name="logits")(h))
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**24),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False,
                      steps_per_execution=steps_per_execution)
    keras.mixed_precision.set_global_policy("float32")
    return model

rng = np.random.default_rng(0)
xs, ys = rng.normal(size=(32, 8, 8, 3)).astype("float32"), rng.integers(0, 10, 32)
model, plain = build(), build()
h1 = model.fit(xs, ys, batch_size=8, verbose=0, shuffle=False, callbacks=[UnderflowTelemetry("run", every=2)])
h2 = plain.fit(xs, ys, batch_size=8, verbose=0, shuffle=False)
try:
    build(steps_per_execution=2).fit(xs, ys, batch_size=8, verbose=0, callbacks=[UnderflowTelemetry("refused")])
    refused = None
except ValueError as error:
    refused = str(error)
print("RESULT" + json.dumps({"refused": refused,
    "same": h1.history == h2.history and all(np.array_equal(a, b) for a, b in zip(model.get_weights(), plain.get_weights())),
    "steps": list(csv.DictReader(open("run/steps.csv"))), "rows": list(csv.DictReader(open("run/telemetry.csv")))}))
'''


@pytest.mark.slow
def test_under_a_mirrored_strategy_counts_pool_every_replica(tmp_path, run_python):
    """Two replicas of 4 images: counts summed over replicas (the conv's activation gradient
    covers the global batch of 8), training unchanged, measured skipped steps named;
    steps_per_execution above 1 refused there (its train function is chosen per step)."""
    import json

    out = json.loads(run_python(MIRRORED, tmp_path).stdout.split("RESULT", 1)[1])
    assert out["same"]
    steps = out["steps"]
    assert [s["telemetry"] for s in steps] == ["True", "False", "True", "False"]
    assert [s["skipped"] for s in steps] == ["True"] * 4  # S = 2^24 .. 2^21 all overflow
    assert [s["first_nonfinite"] for s in steps] == ["activation:dense", "", "activation:dense", ""]
    n = {(r["kind"], r["layer"]): int(r["n"]) for r in out["rows"] if r["step"] == "0"}
    assert n[("activation", "conv")] == 8 * 8 * 8 * 4  # the global batch
    assert n[("weight", "dense/kernel")] == 2 * 4 * 10  # each replica's local gradient, pooled
    assert out["refused"] == ("steps_per_execution must be 1 under a strategy of 2 replicas (any value with "
                              "one replica); received steps_per_execution=2")
