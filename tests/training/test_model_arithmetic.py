"""`use_arithmetic` on a user's own Keras model (not convprobe's ResNet): the Conv2D layers it
computes match the exact emulator bit for bit, forward and filter gradient; the others are
named with their reason; training under a narrow arithmetic differs from native (a positive
control), and after the block the model trains exactly as a native one."""

from __future__ import annotations

import numpy as np
import pytest

from convprobe import emulation as em
from convprobe.errors import InvalidArgument

pytestmark = pytest.mark.tensorflow


def _model():
    """Conv2D (strided, dilated), DepthwiseConv2D, a grouped and a float32 Conv2D, an fp16 and a
    float32 Dense, under mixed_float16, compiled with a LossScaleOptimizer."""
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((9, 9, 4))
        h = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="conv")(x)
        h = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(h)
        h = keras.layers.Conv2D(8, 1, groups=2, name="grouped")(h)
        h = keras.layers.Conv2D(8, 3, padding="same", dilation_rate=2, name="dilated")(h)
        h = keras.layers.Conv2D(8, 1, dtype="float32", name="wide")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        h = keras.layers.Dense(16, activation="relu", name="hidden")(h)
        y = keras.layers.Dense(10, dtype="float32", name="dense")(h)
        model = keras.Model(x, y)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 9, 9, 4)).astype("float32") * 8, rng.integers(0, 10, 16)


def test_the_record_names_every_layer_with_a_kernel_and_why_each_runs_what_it_runs():
    from convprobe.training import use_arithmetic

    model = _model()
    with use_arithmetic(model, "v100:out=fp16") as record:
        pass
    assert [(r["layer"], r["kind"]) for r in record["layers"]] == [
        ("conv", "Conv2D"), ("depthwise", "DepthwiseConv2D"), ("grouped", "Conv2D"), ("dilated", "Conv2D"),
        ("hidden", "Dense")]
    assert record["layers"][2]["filter_shape"] == [1, 1, 4, 8]  # groups=2: half the input channels per filter
    depthwise = record["layers"][1]
    assert (depthwise["family"], depthwise["filter_shape"]) == ("depthwise", [3, 3, 8, 1])
    assert list(depthwise["ops"]) == ["depthwise_conv2d", "depthwise_conv2d_backprop_input",
                                      "depthwise_conv2d_backprop_filter"]
    hidden = record["layers"][4]  # a matmul keyed as identify keys it: the 1x1 conv2d of (rows, 1, 1, K)
    assert (hidden["family"], hidden["input_shape"], hidden["filter_shape"]) == ("matmul", [0, 1, 1, 8], [1, 1, 8, 16])
    assert {op: cell["arithmetic"] for op, cell in hidden["ops"].items()} == {
        "matmul": "v100:out=fp16", "matmul_input_gradient": "v100:out=fp16", "matmul_kernel_gradient": "v100:out=fp16"}
    conv = record["layers"][0]
    assert (conv["input_shape"], conv["filter_shape"], conv["strides"], conv["padding"]) == (
        [0, 9, 9, 4], [3, 3, 4, 8], [2, 2], "SAME")
    assert {op: cell["arithmetic"] for op, cell in conv["ops"].items()} == {
        "conv2d": "v100:out=fp16", "conv2d_backprop_input": "v100:out=fp16", "conv2d_backprop_filter": "v100:out=fp16"}
    assert conv["ops"]["conv2d"]["source"] == "use_arithmetic arithmetic = 'v100:out=fp16'"
    reasons = {r["layer"]: r["reason"] for r in record["not_computed"]}
    assert list(reasons) == ["wide", "dense"]
    assert reasons["wide"].startswith("it computes in float32: the emulated arithmetic takes fp16 operands")
    assert reasons["dense"].startswith("it computes in float32")
    assert record["jit_compile"] == {"model": False, "inside": False}


def test_a_computed_layer_is_the_emulator_bit_for_bit_forward_and_filter_gradient():
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    model = _model()
    layer = model.get_layer("conv")
    rng = np.random.default_rng(1)
    x = tf.constant((rng.normal(size=(2, 9, 9, 4)) * 64).astype(np.float16))
    dy = tf.constant(rng.normal(size=(2, 5, 5, 8)).astype(np.float16))
    spec = "sequential:fp16"
    with use_arithmetic(model, {"conv": spec}):
        with tf.GradientTape() as tape:
            y = layer(x)  # Keras's __call__: the kernel autocast to fp16, the bias (zeros) added after
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(dy, tf.float32))
        dw = tape.gradient(loss, layer.kernel)
    w16 = layer.kernel.numpy().astype(np.float16)
    expected = em.conv2d(x.numpy(), w16, em.parse_model(spec), strides=2, padding="SAME") + np.float16(0)
    assert np.array_equal(y.numpy().view(np.uint16), expected.view(np.uint16))
    expected_dw = em.conv2d_backprop_filter(x.numpy(), dy.numpy(), (3, 3, 4, 8), em.parse_model(spec), strides=2,
                                            padding="SAME")
    assert np.array_equal(dw.numpy(), expected_dw.astype(np.float32))
    native = layer.convolution_op(x, tf.cast(layer.kernel, tf.float16))  # after the block: TensorFlow's own
    assert not np.array_equal(native.numpy().view(np.uint16), expected.view(np.uint16))


def test_a_dense_layer_is_the_emulator_s_dot_bit_for_bit_forward_and_both_gradients():
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    model = _model()
    layer = model.get_layer("hidden")
    rng = np.random.default_rng(3)
    x = tf.constant((rng.normal(size=(5, 8)) * 32).astype(np.float16))
    dy = tf.constant(rng.normal(size=(5, 16)).astype(np.float16))
    spec = em.parse_model("a100")
    with use_arithmetic(model, {"hidden": "a100"}):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = layer(x)  # relu(x @ W + b), W's matmul emulated
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(dy, tf.float32))
        dx, dw = tape.gradient(loss, x), tape.gradient(loss, layer.kernel)
    w16, b16 = layer.kernel.numpy().astype(np.float16), layer.bias.numpy().astype(np.float16)
    matmul = em.dot(x.numpy()[:, None, :], w16.T[None, :, :], spec).astype(np.float16)
    assert np.array_equal(y.numpy(), np.maximum(matmul + b16, 0))
    g = np.where(matmul + b16 > 0, dy.numpy(), np.float16(0))  # through the relu
    expected_dw = em.dot(x.numpy().T[:, None, :], g.T[None, :, :], spec).astype(np.float16)
    expected_dx = em.dot(g[:, None, :], w16[None, :, :], spec).astype(np.float16)
    assert np.array_equal(dw.numpy(), expected_dw.astype(np.float32))
    assert np.array_equal(dx.numpy().view(np.uint16), expected_dx.view(np.uint16))
    assert "call" not in layer.__dict__


def test_training_under_a_narrow_accumulator_differs_and_after_the_block_is_native_again():
    import keras

    from convprobe.training import use_arithmetic

    xs, ys = _data()
    native, emulated = _model(), _model()
    native_history = native.fit(xs, ys, batch_size=8, epochs=2, verbose=0, shuffle=False)
    copy = _model()
    with use_arithmetic(emulated, "sequential:p4_emax15"):  # a 4-bit accumulator: harm that must show
        history = emulated.fit(xs, ys, batch_size=8, epochs=2, verbose=0, shuffle=False)
        copy.set_weights(emulated.get_weights())
        batch_loss = emulated.train_on_batch(xs[:8], ys[:8])  # the loss of the weights before its update
    assert history.history["loss"] != native_history.history["loss"]
    assert batch_loss != copy.train_on_batch(xs[:8], ys[:8])  # the same weights and batch, native
    assert "call" not in emulated.get_layer("conv").__dict__ and emulated.train_function is None
    again = _model()  # from the same weights, one step native in both: bit for bit the same
    again.set_weights(emulated.get_weights())
    for model in (again, emulated):
        model.optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        model.compile(optimizer=model.optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        model.fit(xs[:8], ys[:8], batch_size=8, verbose=0, shuffle=False)
    assert all(np.array_equal(a, b) for a, b in zip(again.get_weights(), emulated.get_weights()))


@pytest.mark.parametrize("arithmetic, kwargs, message", [
    ({"nope": "a100"}, {}, "arithmetic names layer 'nope', which the model does not have; its layers with a kernel "
                           "are conv, depthwise, grouped, dilated, wide, hidden, dense"),
    ({"dense": "a100"}, {}, "arithmetic names layer 'dense', which use_arithmetic cannot compute: it computes in "
                            "float32"),
    ({"wide": "a100"}, {}, "arithmetic names layer 'wide', which use_arithmetic cannot compute: it computes in "
                           "float32"),
    ("twin", {}, "arithmetic 'twin' needs arithmetic_map: the identify map of this model's layers"),
    ("native", {"arithmetic_map": "map.json"}, "arithmetic_map is read by the twin"),
    ("sequentail:fp16", {}, "arithmetic must be native, twin, or a model spec or GPU preset (e.g. v100:out=fp16, a100, "
                            "sequential:fp16); received 'sequentail:fp16' (model must be one of sequential"),
    ({"conv": ""}, {}, "arithmetic['conv'] must be native, twin, or a model spec or GPU preset"),
    ({"grouped": "twin"}, {}, "arithmetic names layer 'grouped', which use_arithmetic cannot compute: a grouped "
                              "Conv2D: Keras runs it through XLA, which identify does not measure"),
    ({"dilated": "twin"}, {}, "a dilated Conv2D: TensorFlow runs it as a conv of a space-to-batch input"),
])
def test_bad_arguments_are_one_line_and_leave_the_model_alone(arithmetic, kwargs, message):
    from convprobe.training import use_arithmetic

    model = _model()
    with pytest.raises(InvalidArgument) as info:
        with use_arithmetic(model, arithmetic, **kwargs):
            pass
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert "--arithmetic" not in str(info.value)
    assert "call" not in model.get_layer("conv").__dict__


def test_an_xla_model_runs_the_block_without_xla_and_gets_its_setting_back():
    from convprobe.training import use_arithmetic

    model = _model()
    model.jit_compile = True
    xs, ys = _data()
    with use_arithmetic(model, "a100") as record:
        assert model.jit_compile is False
        model.fit(xs[:8], ys[:8], batch_size=8, verbose=0)  # tf.numpy_function inside XLA would fail
    assert record["jit_compile"] == {"model": True, "inside": False} and model.jit_compile is True


def test_beside_the_underflow_callback_training_is_what_it_is_without_it(tmp_path):
    from convprobe.training import UnderflowTelemetry, use_arithmetic

    xs, ys = _data()
    histories, weights = [], []
    for callbacks in ([], [UnderflowTelemetry(tmp_path / "run", every=1)]):
        model = _model()
        with use_arithmetic(model, "v100:out=fp16"):
            histories.append(model.fit(xs, ys, batch_size=8, verbose=0, shuffle=False,
                                       callbacks=callbacks).history)
        weights.append(model.get_weights())
    assert histories[0] == histories[1]
    assert all(np.array_equal(a, b) for a, b in zip(*weights))
    rows = [line.split(",") for line in (tmp_path / "run" / "telemetry.csv").read_text().splitlines()]
    layer = rows[0].index("layer")
    assert {"conv/kernel", "conv"} <= {row[layer] for row in rows[1:]}  # the emulated layer's weight and output
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_subclassed_model_s_layers_are_computed_too():
    import keras
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    class Small(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv = keras.layers.Conv2D(4, 3, name="inner_conv", dtype="mixed_float16")
            self.dense = keras.layers.Dense(2, name="inner_dense")

        def call(self, x):
            return self.dense(tf.reduce_mean(tf.cast(self.conv(x), tf.float32), axis=(1, 2)))

    model = Small()
    x = (np.random.default_rng(2).normal(size=(2, 8, 8, 3)) * 16).astype("float32")
    native = model(x).numpy()
    with use_arithmetic(model, "sequential:p4_emax15") as record:
        emulated = model(x).numpy()
    assert [r["layer"] for r in record["layers"]] == ["inner_conv"]
    assert record["layers"][0]["input_shape"] == [2, 8, 8, 3]
    assert [r["layer"] for r in record["not_computed"]] == ["inner_dense"]
    assert not np.array_equal(native, emulated) and np.array_equal(model(x).numpy(), native)


def test_a_nested_model_a_second_block_and_repeated_names_are_handled_or_refused():
    import keras

    from convprobe.training import use_arithmetic

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((6, 6, 2))
        inner = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3, name="c"),
                                  keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4, name="d")], name="inner")
        outer = keras.Model(x, keras.layers.Dense(4, name="d")(inner(x)))
        lstm = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4, name="lstm")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    data = (np.random.default_rng(4).normal(size=(2, 6, 6, 2)) * 16).astype("float32")
    native = inner.predict(data, verbose=0)
    with use_arithmetic(outer, "sequential:p4_emax15") as record:
        inside = inner.predict(data, verbose=0)  # the nested model's own predict function, traced inside
        with pytest.raises(InvalidArgument, match="layer '[cd]' is inside another use_arithmetic block already"):
            with use_arithmetic(outer, "a100"):
                pass
    assert sorted(r["layer"] for r in record["layers"]) == ["c", "d", "d"]  # the outer d and the inner model's
    assert not np.array_equal(inside, native) and np.array_equal(inner.predict(data, verbose=0), native)
    with pytest.raises(InvalidArgument, match="arithmetic names layer 'd', and 2 layers of the model"):
        with use_arithmetic(outer, {"d": "a100"}):
            pass
    with use_arithmetic(lstm, "a100") as record:  # a recurrent cell's kernel: named, never passed over
        pass
    assert [(r["layer"], r["kind"]) for r in record["not_computed"]] == [("lstm_cell", "LSTMCell")]


def test_a_conv2d_is_computed_at_its_built_shape_and_its_input_gradient_is_the_emulator_s():
    import keras
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = keras.layers.Conv2D(3, 3, strides=2, dilation_rate=1, padding="valid", use_bias=False)
        open_ended = keras.Sequential([keras.Input((None, None, 2)), keras.layers.Conv2D(3, 3, name="any")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model = keras.Sequential([keras.Input((9, 9, 2)), layer])
    rng = np.random.default_rng(5)
    x = tf.constant((rng.normal(size=(3, 9, 9, 2)) * 16).astype(np.float32))
    dy = tf.constant(rng.normal(size=(3, 4, 4, 3)).astype(np.float16))
    spec = em.parse_model("v100:out=fp16")
    with use_arithmetic(model, "v100:out=fp16"):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = model(x)  # through Keras's __call__: the input cast to fp16, the kernel autocast
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(dy, tf.float32))
        dx = tape.gradient(loss, x)
        with pytest.raises(InvalidArgument, match="is computed at the 9x9 inputs it was built on; received 11x11"):
            model(tf.zeros((1, 11, 11, 2)))
    w16 = layer.kernel.numpy().astype(np.float16)
    expected = em.conv2d(x.numpy().astype(np.float16), w16, spec, strides=2, padding="VALID")
    assert np.array_equal(y.numpy().view(np.uint16), expected.view(np.uint16))
    expected_dx = em.conv2d_backprop_input(dy.numpy(), w16, (3, 9, 9, 2), spec, strides=2, padding="VALID")
    assert np.array_equal(dx.numpy(), expected_dx.astype(np.float32))
    with pytest.raises(InvalidArgument, match="layer 'any' was built on inputs of unknown size"):
        with use_arithmetic(open_ended, "a100"):
            pass


@pytest.mark.parametrize("padding, strides, dilation", [("same", 1, 1), ("valid", 2, 1), ("causal", 1, 2)])
def test_a_conv1d_is_the_2d_convolution_of_height_one_bit_for_bit(padding, strides, dilation):
    import keras
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = keras.layers.Conv1D(3, 3, strides=strides, dilation_rate=dilation, padding=padding, name="c1")
        model = keras.Sequential([keras.Input((11, 2)), layer])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rng = np.random.default_rng(6)
    x = tf.constant((rng.normal(size=(2, 11, 2)) * 16).astype(np.float32))
    length = layer.compute_output_shape((2, 11, 2))[1]
    dy = tf.constant(rng.normal(size=(2, length, 3)).astype(np.float16))
    spec = em.parse_model("sequential:fp16")
    with use_arithmetic(model, "sequential:fp16") as record:
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = model(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(dy, tf.float32))
        dx, dw = tape.gradient(loss, x), tape.gradient(loss, layer.kernel)
    assert record["layers"][0]["kind"] == "Conv1D" and record["not_computed"] == []
    left = dilation * 2 if padding == "causal" else 0  # Keras pads a causal conv on the left, then VALID
    x16 = np.pad(x.numpy().astype(np.float16), ((0, 0), (left, 0), (0, 0)))[:, None]
    w16 = layer.kernel.numpy().astype(np.float16)[None]
    conv = dict(strides=(1, strides), dilation=(1, dilation), padding="VALID" if padding == "causal" else padding.upper())
    y_expected = em.conv2d(x16, w16, spec, **conv)[:, 0] + layer.bias.numpy().astype(np.float16)
    assert np.array_equal(y.numpy().view(np.uint16), y_expected.view(np.uint16))
    assert not np.array_equal(model(x).numpy().view(np.uint16), y_expected.view(np.uint16))  # TensorFlow's own
    dw_expected = em.conv2d_backprop_filter(x16, dy.numpy()[:, None], w16.shape, spec, **conv)[0]
    assert np.array_equal(dw.numpy(), dw_expected.astype(np.float32))
    dx_expected = em.conv2d_backprop_input(dy.numpy()[:, None], w16, x16.shape, spec, **conv)[:, 0, left:]
    assert np.array_equal(dx.numpy(), dx_expected.astype(np.float32))


def test_a_grouped_conv2d_is_the_emulator_s_grouped_convolution_bit_for_bit():
    import keras
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = keras.layers.Conv2D(6, 3, groups=3, padding="same", use_bias=False, name="g")
        model = keras.Sequential([keras.Input((7, 7, 6)), layer])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rng = np.random.default_rng(7)
    x = tf.constant((rng.normal(size=(2, 7, 7, 6)) * 16).astype(np.float32))
    dy = tf.constant(rng.normal(size=(2, 7, 7, 6)).astype(np.float16))
    spec = em.parse_model("sequential:fp16")
    with use_arithmetic(model, "sequential:fp16"):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = model(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.cast(dy, tf.float32))
        dx, dw = tape.gradient(loss, x), tape.gradient(loss, layer.kernel)
    x16, w16 = x.numpy().astype(np.float16), layer.kernel.numpy().astype(np.float16)
    conv = dict(padding="SAME", groups=3)
    expected = em.conv2d(x16, w16, spec, **conv)
    assert np.array_equal(y.numpy().view(np.uint16), expected.view(np.uint16))
    assert np.array_equal(dw.numpy(), em.conv2d_backprop_filter(x16, dy.numpy(), w16.shape, spec, **conv)
                          .astype(np.float32))
    assert np.array_equal(dx.numpy(), em.conv2d_backprop_input(dy.numpy(), w16, x16.shape, spec, **conv)
                          .astype(np.float32))
    assert not np.array_equal(model(x).numpy().view(np.uint16), expected.view(np.uint16))  # TensorFlow's own


def test_native_takes_a_model_of_any_size_and_names_its_layers():
    """A layer left to TensorFlow's kernel is not computed at a built shape: a model built on
    unknown sizes runs natively, and the record names its layers."""
    import keras
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    inputs = keras.Input((None, None, 2))
    model = keras.Model(inputs, keras.layers.Conv2D(3, 3, dtype="mixed_float16", name="any")(inputs))
    with use_arithmetic(model, "native") as record:
        y = model(tf.zeros((1, 7, 9, 2)))
    assert y.shape == (1, 5, 7, 3)
    (entry,) = record["layers"]
    assert entry["layer"] == "any" and "unknown size" in entry["ops"]["every op"]["source"]


def test_an_einsum_dense_that_is_a_matmul_is_the_emulator_s_dot_and_any_other_is_named():
    """EinsumDense('abc,cd->abd') is the Dense of its last axis: computed bit for bit as `dot`
    under a model spec; an equation that is no such matmul, and the twin, leave it to TensorFlow."""
    import keras
    import tensorflow as tf

    from convprobe.training import use_arithmetic

    keras.utils.set_random_seed(2)
    inputs = keras.Input((3, 8))
    matmul = keras.layers.EinsumDense("abc,cd->abd", output_shape=(3, 5), bias_axes="d", dtype="mixed_float16",
                                      name="matmul")
    other = keras.layers.EinsumDense("abc,cde->abde", output_shape=(3, 5, 2), dtype="mixed_float16", name="other")
    model = keras.Model(inputs, [matmul(inputs), other(inputs)])
    matmul.bias.assign(np.linspace(-1, 1, 5))
    x = tf.constant(np.random.default_rng(4).normal(size=(2, 3, 8)).astype(np.float32) * 4)
    spec = "sequential:fp16"
    with use_arithmetic(model, spec) as record:
        y = model(x)[0]
    assert [r["layer"] for r in record["layers"]] == ["matmul"]
    assert record["layers"][0]["input_shape"] == [0, 1, 1, 8]
    assert "not a matmul over the input's last axis" in record["not_computed"][0]["reason"]
    rows = x.numpy().astype(np.float16).reshape(-1, 8)
    w16 = matmul.kernel.numpy().astype(np.float16)
    product = np.asarray(em.dot(rows[:, None, :], w16.T[None, :, :], em.parse_model(spec))).astype(np.float16)
    expected = (product + matmul.bias.numpy().astype(np.float16)).reshape(2, 3, 5)
    assert np.array_equal(y.numpy().view(np.uint16), expected.view(np.uint16))
    with pytest.raises(InvalidArgument, match="an EinsumDense: TensorFlow runs its Einsum op, which identify"):
        with use_arithmetic(model, {"matmul": "twin"}):
            pass
