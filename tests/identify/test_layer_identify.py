"""identify at a layer's own shape: the crafted-input structure probe and its confirmation.

The emulator is the ground truth for the probe (it must measure, from the emulator,
the structure of the model it was given); real TensorFlow is the target (every op
of the measured layers matches 100%, at two seeds).
"""

import json

import numpy as np
import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.errors import InvalidArgument
from convprobe.emulation import conv2d, conv2d_backprop_filter, conv2d_backprop_input, parse_model
from convprobe.identify import column_patterns, layer_patterns
from convprobe.identify import candidates, structure
from convprobe.identify.layer_identify import INPUT_SETS, _settling_spec
from convprobe.identify.structure import Structure
from convprobe.probes.layers import (DEPTHWISE_OPS, LAYER_OPS, MATMUL_OPS, Layer, LayerKind, op_confirmation_inputs, op_inputs,
                                     run_op, run_ops)
from conftest import run_cli, run_cli_json

LAYER = Layer((1, 8, 8, 256), (3, 3, 256, 8))

MODELS = [  # each a structure the probe must recover at LAYER's forward conv (K = 2304)
    "chunked:fp16:n=320:product=fp16:total=fp16",
    "splitk(length=320, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
    "splitk(length=1152, splitk(length=320, sequential:fp16:product=fp16, combine=fp16), combine=fp16)",
    "chunked:fp16:n=1000:total=fp16",
    "chunked:fp16:n=1032:addition=fp32:total=fp16",
    "splitk(length=1024, lanes(2, sequential:fp16:addition=fp32, combine=sequential:fp16), combine=fp16)",
    "lanes(4, sequential:fp32, combine=pairwise:fp32, output=fp16)",
    "splitk(length=256, lanes(8, sequential:fp32, combine=sequential:fp32), combine=fp32, output=fp16)",
    "sequential:fp32:output=fp16",
    "chunked:fp32:n=64:product=fp16:total=fp16:output=fp16",  # wide chunks into an fp16 total
    "chunked:fp32:n=512:total=fp32:output=fp16",
    # fp16 SIMD lanes summed in fp32 by the halving tree (Eigen's vectorised half dot product)
    f"lanes(8, sequential:fp16:addition=fp32, combine={candidates.halving(8).to_spec()})",
    "lanes(4, chunked:fp16:n=96:total=fp16, combine=pairwise:fp32:output=fp16)",
    # summed from K-1 down (an input gradient over a reversed dy), in fp16 and in fp32
    "reverse(sequential:fp16:product=fp16)",
    "reverse(chunked:fp32:n=512:total=fp32:output=fp16)",
    # chunk sums combined in a tree
    "splitk(length=256, sequential:fp32, combine=pairwise:fp32, output=fp16)",
    # two threads' halves at a chunk multiple (XLA's K = 2048): the same starts as plain chunks
    "splitk(length=1152, chunked:fp32:n=288:total=fp32, combine=fp32, output=fp16)",
]


@pytest.mark.parametrize("spec", MODELS)
def test_the_probe_measures_the_emulated_models_structure(spec):
    measured = layer_patterns.measure(EmulatedBackend(spec), LAYER, "conv2d")
    specs = candidates.candidate_specs(measured, LAYER.k("conv2d"))
    assert parse_model(spec).to_spec() in [parse_model(s).to_spec() for s in specs], (measured, specs)


@pytest.mark.parametrize("spec,layer", [
    ("chunked:fp16:n=320", LAYER),  # fp32 totals: every start after the first is hidden from B at 0
    ("lanes(4, sequential:fp16, combine=sequential:fp16)", Layer((1, 6, 6, 17), (1, 1, 17, 4))),  # K = 1 mod 4
    ("lanes(4, sequential:fp32, combine=pairwise:fp32, output=fp16)", Layer((1, 6, 6, 18), (1, 1, 18, 4))),
    ("splitk(length=32, lanes(8, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
     Layer((1, 6, 6, 128), (1, 1, 128, 8))),  # chunks shorter than the lane sweep
    ("chunked:fp16:n=64:total=fp16", Layer((1, 6, 6, 129), (1, 1, 129, 8))),  # a start near K-1
    # backward chunks that a triple 16 apart straddles (XLA's input gradient over a reversed dy)
    ("reverse(chunked:fp32:n=96:total=fp32:output=fp16)", Layer((1, 6, 6, 128), (1, 1, 128, 4))),
    # two terms a lane, products rounded: Eigen's K = 16 half dot product
    (f"lanes(8, sequential:fp16:product=fp16, combine={candidates.halving(8).to_spec()})", Layer((1, 6, 6, 16), (1, 1, 16, 4))),
    # the last terms after the lanes' combine: Eigen's depth remainder (K = 9 = 8 + 1)
    ("lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, tail=1)", Layer((2, 8, 8, 1), (3, 3, 1, 8))),
    ("lanes(4, sequential:fp32, combine=pairwise:fp32, tail=5, output=fp16)", Layer((1, 6, 6, 21), (1, 1, 21, 4))),
])
def test_hard_structures_are_measured_and_reproduced(spec, layer):
    backend = EmulatedBackend(spec)
    measured = layer_patterns.measure(backend, layer, "conv2d")
    specs = candidates.candidate_specs(measured, layer.k("conv2d"))
    x, w = op_inputs(layer, "conv2d", 5)
    truth = run_op(backend, layer, "conv2d", x, w)
    assert any(np.array_equal(run_op(EmulatedBackend(s), layer, "conv2d", x, w).view(np.uint16), truth.view(np.uint16))
               for s in specs), (measured, specs)


@pytest.mark.parametrize("tail", [0, 1, 3, 7])
def test_the_lanes_tail_is_measured_term_by_term(tail):
    """K = 23 in two fp16 lanes: the last `tail` terms added after the combine, and no others."""
    spec = f"lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, tail={tail})"
    measured = layer_patterns.measure(EmulatedBackend(spec), Layer((1, 6, 6, 23), (1, 1, 23, 4)), "conv2d")
    assert (measured.lanes, measured.lanes_tail) == (2, tail), measured


def test_lanes_folded_last_to_first_are_not_taken_for_a_backward_sum():
    """Eigen folds its packet accumulators p0 + (p1 + (p2 + p3)): terms next to each other
    then meet in reverse, but a lane's own terms run forward. Measured as lanes, with a
    candidate that reproduces it, at K = 64 and at K = 65 (a lane one term longer)."""
    spec = "lanes(4, sequential:fp16, combine=reverse(sequential:fp16))"
    for layer in (Layer((1, 6, 6, 64), (1, 1, 64, 4)), Layer((1, 6, 6, 65), (1, 1, 65, 4))):
        backend = EmulatedBackend(spec)
        measured = layer_patterns.measure(backend, layer, "conv2d")
        assert not measured.backwards and measured.lanes == 4, measured
        x, w = op_inputs(layer, "conv2d", 5)
        truth = run_op(backend, layer, "conv2d", x, w).view(np.uint16)
        specs = candidates.candidate_specs(measured, layer.k("conv2d"))
        assert any(np.array_equal(run_op(EmulatedBackend(s), layer, "conv2d", x, w).view(np.uint16), truth)
                   for s in specs), (measured, specs)


@pytest.mark.parametrize("k", [4, 5, 7])
@pytest.mark.parametrize("spec", ["sequential:fp16", "sequential:fp16:product=fp16", "sequential:fp16:addition=fp32",
                                  "sequential:fp32:output=fp16", "reverse(sequential:fp16:product=fp16)"])
def test_a_short_reduction_has_its_accumulator_and_products_measured(spec, k):
    """K < 8: no room to sweep lanes or starts (one chain assumed, and said); the accumulator,
    the products, the direction and the double rounding are measured and give the model back."""
    measured = layer_patterns.measure(EmulatedBackend(spec), Layer((1, 4, 4, k), (1, 1, k, 4)), "conv2d")
    assert "one chain assumed" in measured.note and measured.lanes == 1, measured
    assert parse_model(spec).to_spec() in [parse_model(s).to_spec() for s in candidates.candidate_specs(measured, k)]


@pytest.mark.parametrize("k", [4, 5, 7])
def test_a_short_reductions_wider_accumulator_is_named(k):
    measured = layer_patterns.measure(EmulatedBackend("exact:fp64"), Layer((1, 4, 4, k), (1, 1, k, 4)), "conv2d")
    assert measured.accumulator == "wider than fp32", measured


def test_a_wider_accumulator_is_named_not_forced():
    measured = layer_patterns.measure(EmulatedBackend("exact:fp64"), LAYER, "conv2d")
    assert measured.accumulator == "wider than fp32" and measured.boundaries is None


@pytest.mark.parametrize("op", LAYER_OPS)
@pytest.mark.parametrize("layer", [
    Layer((2, 7, 7, 4), (3, 3, 4, 5), padding="VALID"),
    Layer((2, 9, 8, 3), (3, 2, 3, 4), strides=(2, 1)),
    Layer((1, 9, 9, 2), (3, 3, 2, 3), dilation=(2, 1)),
], ids=lambda layer: layer.label)
def test_crafted_rows_land_in_the_emulators_reduction_order(op, layer):
    """Random fp16 rows summed in an order-sensitive fp16 accumulator: pattern_outputs must
    give exactly what the emulator's dot gives for the rows in their own order."""
    from convprobe.emulation import dot

    if layer_patterns.pattern_rows(layer, op)[0] == 0:
        pytest.skip(layer_patterns.pattern_rows(layer, op)[1])  # strided input gradient: not measured
    k = layer.k(op)
    rows = np.random.default_rng(1).uniform(0, 1, (6, k)).astype(np.float16).astype(np.float64)
    model = parse_model("sequential:fp16")
    got = layer_patterns.pattern_outputs(EmulatedBackend(model), layer, op, rows, 1.0)
    want = np.asarray(dot(rows, np.ones_like(rows), model), dtype=np.float64)
    np.testing.assert_array_equal(got, want)
    reversed_order = np.asarray(dot(rows[:, ::-1], np.ones_like(rows), model), dtype=np.float64)
    assert not np.array_equal(got, reversed_order) or k < 4  # the order is visible in these sums


@pytest.mark.parametrize("op", LAYER_OPS)
def test_crafted_rows_are_exact_sums_on_every_op(op):
    """pattern_outputs puts row r's terms at the K positions the emulator's conv API reduces."""
    layer = Layer((2, 6, 6, 4), (3, 3, 4, 5))
    k = layer.k(op)
    rng = np.random.default_rng(3)
    patterns = rng.integers(-8, 9, (7, k)).astype(np.float64)  # small integers: every order is exact
    got = layer_patterns.pattern_outputs(EmulatedBackend("sequential:fp32"), layer, op, patterns, 1.0)
    np.testing.assert_array_equal(got, patterns.sum(axis=1))
    # one term moved to the next position changes the result under a position-sensitive model
    row = np.zeros((1, k))
    row[0, 0], row[0, 1], row[0, 2] = 2048.0, 1.0, 1.0
    seq16 = EmulatedBackend("sequential:fp16")
    assert layer_patterns.pattern_outputs(seq16, layer, op, row, 1.0)[0] == 2048.0
    row[0, 0], row[0, k - 1] = 0.0, 2048.0  # the ones first: 1 + 1 = 2 survives
    assert layer_patterns.pattern_outputs(seq16, layer, op, row, 1.0)[0] == 2050.0


@pytest.mark.parametrize("boundaries,k,fit", [
    ([320, 640, 960], 1024, (None, 320)),
    ([320, 640, 961], 1024, None),
    ([320, 512, 832], 1024, (512, 320)),
    ([320, 513, 834], 1024, None),
    ([320, 513, 833], 1024, (513, 320)),
    ([], 1024, (None, None)),
    ([1160], 2304, (None, 1160)),
    ([1160], 2400, None),  # a second chunk would start at 2320
    ([1160], 2321, (None, 1160)),  # ... but a start at K-1 leaves no room to see it
])
def test_boundaries_fit_a_chunk_and_split_grid_or_nothing(boundaries, k, fit):
    assert structure.grids(boundaries, k) == fit


def test_a_strided_input_gradient_is_not_measured_and_says_why():
    layer = Layer((1, 8, 8, 4), (3, 3, 4, 6), strides=(2, 2))
    measured = layer_patterns.measure(EmulatedBackend("sequential:fp16"), layer, "conv2d_backprop_input")
    assert measured.accumulator is None and "strided" in measured.note
    assert candidates.candidate_specs(measured, layer.k("conv2d_backprop_input"))[0] == \
        "chunked:fp16:n=6:total=fp16:product=fp16"  # (canonical spelling: candidates are models)


def test_run_op_is_the_emulator_conv_api():
    layer = Layer((2, 7, 7, 3), (3, 3, 3, 4), strides=(2, 1), padding="VALID")
    model = parse_model("chunked:fp16:n=5:product=fp16:total=fp16")
    backend = EmulatedBackend(model)
    x, w = op_inputs(layer, "conv2d", 0)
    np.testing.assert_array_equal(run_op(backend, layer, "conv2d", x, w),
                                  conv2d(x, w, model, **layer.conv_args).astype(np.float16))
    dy, w = op_inputs(layer, "conv2d_backprop_input", 0)
    np.testing.assert_array_equal(run_op(backend, layer, "conv2d_backprop_input", dy, w),
                                  conv2d_backprop_input(dy, w, layer.input_shape, model, **layer.conv_args)
                                  .astype(np.float16))
    x, dy = op_inputs(layer, "conv2d_backprop_filter", 0)
    np.testing.assert_array_equal(run_op(backend, layer, "conv2d_backprop_filter", x, dy),
                                  conv2d_backprop_filter(x, dy, layer.filter_shape, model, **layer.conv_args)
                                  .astype(np.float16))


def test_an_emulated_configuration_is_identified_as_its_own_model():
    spec = "chunked:fp16:n=320:product=fp16:total=fp16"
    doc = run_cli_json("identify", "--configs", "none", "--model", spec,
                       "--input-shape", "1,8,8,64", "--filter-shape", "3,3,64,16")
    (per_op,) = doc["matches"].values()
    assert per_op["conv2d"]["summary"]["best"] == parse_model(spec).to_spec()
    assert per_op["conv2d"]["summary"]["fractions"] == {"576": 1.0}
    assert all(e["summary"]["stops_matching_at"] is None for e in per_op.values())


@pytest.mark.tensorflow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras' own save path, not ours
def test_a_keras_model_gives_a_per_layer_map(tmp_path):
    import keras

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", name="first")(inputs)
    x = keras.layers.Conv2D(8, 3, padding="same", name="same_shape_as_second")(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="repeat")(x)
    x = keras.layers.Conv2D(16, 1, strides=2, padding="valid", name="projection")(x)
    path = tmp_path / "small.keras"
    keras.Model(inputs, x).save(path)
    doc = run_cli_json("identify", "--configs", "none", "--model", "sequential:fp16", "--keras-model", str(path),
                       "--batch", "2", "--output", str(tmp_path / "map.json"))
    keys = list(doc["matches"]["emulated/sequential:fp16"])
    assert [k.split(" / ")[0] for k in keys[::3]] == ["first", "same_shape_as_second", "projection"]
    layers = [json.dumps(e["layer"]) for e in doc["matches"]["emulated/sequential:fp16"].values()]
    assert len(set(layers)) == 3  # 'repeat' has the second layer's shape: one row
    proc = run_cli("report", str(tmp_path / "map.json"), "--out-dir", str(tmp_path / "figures"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "figures" / "map-layers.png").stat().st_size > 10_000


@pytest.mark.tensorflow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras' own save path, not ours
def test_every_conv_like_layer_is_identified_or_listed_with_its_reason(tmp_path):
    """Conv2D, DepthwiseConv2D, both halves of SeparableConv2D, a Conv2DTranspose (as the conv2d
    it transposes) and a grouped Conv2D's forward op are identified (on TensorFlow's default CPU
    configuration, every op it runs at 100% on both input sets); a grouped gradient is
    identified where TensorFlow runs it (oneDNN does on a CPU with AVX512-FP16) and is a row
    that says why where TensorFlow refuses it (as on AMD Zen 4); a Conv1D is identified as the
    conv2d of height 1 and a Dense on a rank-3 input as the matmul of its rows; an EinsumDense
    is a row that says why it is not measured, in the table, the JSON and the figure."""
    import keras

    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(8, 3, padding="same", name="plain")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=3, name="depthwise")(x)
    x = keras.layers.SeparableConv2D(8, 3, padding="same", strides=2, name="separable")(x)
    x = keras.layers.Conv2D(8, 3, padding="same", groups=2, name="grouped")(x)
    x = keras.layers.Conv2DTranspose(4, 3, padding="same", name="transposed")(x)
    x = keras.layers.Conv1D(3, 3, name="one_d")(keras.layers.Reshape((16, 4))(x))
    x = keras.layers.Dense(5, name="dense")(x)  # on (batch, 14, 3): a matmul of batch * 14 rows
    x = keras.layers.EinsumDense("ab,bc->ac", output_shape=4, name="einsum")(keras.layers.Flatten()(x))
    path = tmp_path / "mixed.keras"
    keras.Model(inputs, x).save(path)
    doc = run_cli_json("identify", "--configs", "default", "--keras-model", str(path), "--batch", "2",
                       "--output", str(tmp_path / "map.json"))
    matches = doc["matches"]["tensorflow/cpu/default"]
    identified = {key: entry for key, entry in matches.items() if entry["status"] == "ok"}
    reasons = {key: entry["error"] for key, entry in matches.items() if entry["status"] != "ok"}
    grouped_gradients = ["grouped / conv2d_backprop_input", "grouped / conv2d_backprop_filter"]
    refused = [key for key in grouped_gradients if key in reasons]
    assert all("grouped" in reasons[key] for key in refused), reasons
    assert [key.split(" / ")[0] for key in identified] == [
        *["plain"] * 3, *["depthwise"] * 3, *["separable/depthwise"] * 3, *["separable/pointwise"] * 3,
        *["grouped"] * (3 - len(refused)), *["transposed (transposed)"] * 3, *["one_d"] * 3, *["dense"] * 3]
    assert [key.split(" / ")[1] for key in identified][3:6] == list(DEPTHWISE_OPS)
    assert [key.split(" / ")[1] for key in identified][-3:] == list(MATMUL_OPS)
    assert identified["one_d / conv2d"]["layer"]["input_shape"] == [2, 1, 16, 4]  # the conv2d of height 1
    assert identified["dense / matmul"]["layer"]["input_shape"] == [2 * 14, 1, 1, 3]
    for key, entry in identified.items():
        summary = entry["summary"]
        assert summary["stops_matching_at"] is None, (key, summary["explanation"])
        assert summary["confirmation"]["fractions"][summary["best"]] == 1.0
    # (which model: Eigen's depthwise loop on AMD Zen 4, sequential fp32 on a CPU with AVX512-FP16)
    assert identified["grouped / conv2d"]["layer"]["filter_shape"] == [3, 3, 4, 8]  # two groups of 4 channels
    assert set(reasons) == {*refused, "einsum / EinsumDense"}, reasons
    assert reasons["einsum / EinsumDense"].startswith("not identified: EinsumDense: identify measures Conv1D, Conv2D, "
                                                      "Conv2DTranspose, DepthwiseConv2D, SeparableConv2D, Dense")
    assert [item["name"] for item in doc["params"]["not_identified"]] == ["einsum"]
    proc = run_cli("report", str(tmp_path / "map.json"), "--out-dir", str(tmp_path / "figures"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.tensorflow
@pytest.mark.parametrize(("strides", "padding"), [(1, "same"), (2, "same"), (2, "valid")])
def test_a_transposed_layer_runs_the_three_ops_of_the_conv2d_identify_measures_for_it(strides, padding):
    """The premise of measuring a Conv2DTranspose as the conv2d it transposes, checked on
    TensorFlow itself: the Keras layer's output and both its gradients, in fp16 on signed,
    spread operands, are bit for bit that conv2d's input gradient, forward and filter gradient."""
    import keras
    import tensorflow as tf

    from convprobe.backends.tensorflow import TensorFlowBackend
    from convprobe.probes.layers import keras_layers, run_op

    inputs = keras.Input((5, 5, 6), dtype="float16")
    transposed = keras.layers.Conv2DTranspose(7, 3, strides=strides, padding=padding, dtype="float16",
                                              use_bias=False, name="up")
    model = keras.Model(inputs, transposed(inputs))
    (layer,), skipped = keras_layers(model, batch=2)
    assert not skipped and layer.name == "up (transposed)"
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 5, 5, 6)) * np.exp2(rng.integers(-6, 6, (2, 5, 5, 6)))).astype(np.float16)
    kernel = (rng.standard_normal((3, 3, 7, 6)) * np.exp2(rng.integers(-6, 6, (3, 3, 7, 6)))).astype(np.float16)
    transposed.kernel.assign(kernel)
    upstream = rng.standard_normal(layer.input_shape).astype(np.float16)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = transposed(xt)
    dx, dk = tape.gradient(y, [xt, transposed.kernel], output_gradients=tf.constant(upstream))
    backend = TensorFlowBackend("cpu")
    pairs = {"conv2d_backprop_input": (y, x, kernel), "conv2d": (dx, upstream, kernel),
             "conv2d_backprop_filter": (dk, upstream, x)}
    for op, (keras_result, first, second) in pairs.items():
        ours = run_op(backend, layer, op, first, second)
        theirs = np.asarray(keras_result).astype(np.float16)
        assert theirs.shape == ours.shape, (op, theirs.shape, ours.shape)
        differ = np.flatnonzero(theirs.view(np.uint16) != ours.view(np.uint16))
        assert differ.size == 0, (f"{op}: {differ.size} of {ours.size} outputs differ, first at "
                                  f"{differ[:3]}: keras {theirs.ravel()[differ[:3]]}, conv2d's op {ours.ravel()[differ[:3]]}")


def _depthwise_reference(layer: Layer, op: str, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The depthwise op in float64 by its definition, loop by loop: the layout the emulator's
    grouped convolutions must reproduce."""
    n, h, w, c = layer.input_shape
    kh, kw, _, mult = layer.filter_shape
    _, oh, ow, _ = layer.output_shape
    (top, _), (left, _) = layer.pads
    x, wt, dy = (first, second, None) if op == "depthwise_conv2d" else (
        (None, second, first) if op == "depthwise_conv2d_backprop_input" else (first, None, second))
    out = np.zeros(layer.output_shape if op == "depthwise_conv2d" else
                   (layer.input_shape if op == "depthwise_conv2d_backprop_input" else layer.filter_shape))
    sh, sw = layer.strides
    for b, i, j, ch, m, r, q in np.ndindex(n, oh, ow, c, mult, kh, kw):
        y, z = i * sh + r - top, j * sw + q - left
        if not (0 <= y < h and 0 <= z < w):
            continue
        if op == "depthwise_conv2d":
            out[b, i, j, ch * mult + m] += float(x[b, y, z, ch]) * float(wt[r, q, ch, m])
        elif op == "depthwise_conv2d_backprop_input":
            out[b, y, z, ch] += float(dy[b, i, j, ch * mult + m]) * float(wt[r, q, ch, m])
        else:
            out[r, q, ch, m] += float(x[b, y, z, ch]) * float(dy[b, i, j, ch * mult + m])
    return out


@pytest.mark.parametrize("op", DEPTHWISE_OPS)
@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_the_emulator_s_depthwise_ops_are_the_definition(op, strides):
    layer = Layer((2, 5, 5, 3), (3, 3, 3, 2), strides, "SAME", (1, 1), "dw", LayerKind.DEPTHWISE)
    first, second = op_confirmation_inputs(layer, op, 3)
    got = run_op(EmulatedBackend("exact:fp64"), layer, op, first, second)
    want = _depthwise_reference(layer, op, first, second).astype(np.float16)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), np.argwhere(got != want)[:5]


def test_a_grouped_layer_reduces_one_group_and_is_measured_at_one_groups_conv():
    layer = Layer((2, 6, 6, 8), (3, 3, 2, 12), name="g")
    assert layer.groups == 4 and layer.label == "2x6x6x8 * 3x3x2x12 s1 SAME g4"
    assert [layer.k(op) for op in layer.ops] == [18, 27, 72]
    assert layer.one_group() == Layer((2, 6, 6, 2), (3, 3, 2, 3)) and layer.one_group().groups == 1
    with pytest.raises(InvalidArgument, match=r"filter-shape input channels \(3\) must equal input-shape channels "
                                              r"\(8\), or divide them into groups"):
        Layer((2, 6, 6, 8), (3, 3, 3, 12))
    with pytest.raises(InvalidArgument, match="groups that also divide the output channels"):
        Layer((2, 6, 6, 8), (3, 3, 2, 6))


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_grouped_layer_is_identified_in_every_op_strict_xla_runs(tmp_path):
    """Strict XLA runs a grouped conv's three ops on the CPU (TensorFlow's own kernels refuse the
    gradients); its filter gradient interleaves the batch's images, which only the tree recovered
    through the grouped op itself reproduces. Every op at 100% on both input sets, and the sign
    of a zero result measured in each configuration."""
    doc = run_cli_json("identify", "--configs", "default,jit+strict", "--input-shape", "2,6,6,8", "--filter-shape",
                       "3,3,2,12", "--output", str(tmp_path / "grouped.json"))
    for op, entry in doc["matches"]["tensorflow/cpu/jit+strict"].items():
        summary = entry["summary"]
        assert summary["stops_matching_at"] is None, (op, summary["explanation"])
        assert summary["confirmation"]["fractions"][summary["best"]] == 1.0, (op, summary["best"])
        assert "summation trees, where needed, through the grouped op itself" in summary["explanation"]
        # strict XLA lands each sum on a +0 output; oneDNN's default conv keeps IEEE's -0
        assert parse_model(summary["best"]).zeros == "positive", (op, summary["best"])
    default = doc["matches"]["tensorflow/cpu/default"]["conv2d"]["summary"]
    assert default["stops_matching_at"] is None and parse_model(default["best"]).zeros == "signed", default["best"]


@pytest.mark.parametrize("op", ["conv2d", "conv2d_backprop_input"])
@pytest.mark.parametrize("filter_shape", [(3, 3, 8, 6), (3, 3, 2, 12), (3, 3, 4, 6)])
def test_every_output_meets_a_cancelling_pair_inside_its_own_group(op, filter_shape):
    """The confirmation inputs plant +M and -M where a reduction meets ones: counted through the
    exact emulator on indicator operands, every output of a dense or grouped layer sums at least
    one +M product and one -M product."""
    layer = Layer((2, 5, 5, 8), filter_shape)
    first, second = op_confirmation_inputs(layer, op, 4)
    exact = EmulatedBackend("exact:fp64")
    ones = (first == 1.0).astype(np.float16)
    for sign in (1.0, -1.0):
        marked = (second == sign * 2.0**14).astype(np.float16)
        counts = run_op(exact, layer, op, ones, marked).astype(np.float64)
        interior = counts[:, 1:-1, 1:-1, :]  # (padding can take a tap away at the border)
        assert interior.min() >= 1, (sign, np.argwhere(interior < 1)[:5])


def test_a_depthwise_layers_trees_are_recovered_through_its_own_ops():
    """A depthwise kernel that no candidate foresees (two fp16 lanes combined pairwise) is
    recovered as the grouped conv2d it is, through the depthwise ops themselves, and its
    tree model reproduces every output of all three ops on both input sets."""
    from convprobe.identify import layer_identify

    truth = "lanes(2, sequential:fp16:product=fp16, combine=pairwise:fp16)"
    layer = Layer((2, 7, 7, 6), (3, 3, 6, 2), (1, 1), "SAME", (1, 1), "dw", LayerKind.DEPTHWISE)
    assert truth not in [spec for op in layer.ops for spec in layer_identify.depthwise_candidates(layer, op)]
    observed = layer_identify.run(EmulatedBackend(truth), layers=[layer.to_dict()], seed=0)
    for _, op, entry in layer_identify.identify_observed(observed):
        summary = entry["summary"]
        assert summary["trees"]["classes"] and not summary["trees"]["note"], (op, summary["trees"])
        assert summary["best"].startswith("tree(") and summary["stops_matching_at"] is None, (op, summary["best"])
        assert summary["confirmation"]["fractions"][summary["best"]] == 1.0


def test_a_depthwise_layer_has_its_own_ops_and_reduction_lengths():
    layer = Layer((2, 9, 9, 6), (3, 3, 6, 2), (2, 2), "SAME", (1, 1), "dw", LayerKind.DEPTHWISE)
    assert layer.ops == DEPTHWISE_OPS and layer.output_shape == (2, 5, 5, 12)
    assert [layer.k(op) for op in layer.ops] == [9, 18, 50]
    assert Layer.from_dict(layer.to_dict()) == layer and Layer.from_dict(layer.to_dict()).kind is LayerKind.DEPTHWISE
    assert Layer.from_dict({**layer.to_dict(), "kind": "conv2d", "filter_shape": [3, 3, 6, 4]}).ops == LAYER_OPS


def test_a_spec_that_fails_the_confirmation_inputs_is_not_reported_at_100_percent():
    """pairwise:fp32 and sequential:fp32 round alike on U[0, 1) operands at this layer; the
    confirmation inputs (signed, a cancelling +-M pair) tell them apart, so pairwise is not
    reported as a match of a sequential fp32 configuration."""
    from convprobe.identify import layer_identify

    layer = Layer((2, 9, 9, 24), (3, 3, 24, 40))
    observed = layer_identify.run(EmulatedBackend("sequential:fp32:output=fp16"), layers=[layer.to_dict()], seed=0)
    ((_, _, entry), *_) = layer_identify.identify_observed(observed, ["pairwise:fp32:output=fp16"])
    summary = entry["summary"]
    assert summary["table"]["pairwise:fp32:output=fp16"] == 1.0  # U[0, 1) cannot tell them apart
    assert summary["confirmation"]["fractions"]["pairwise:fp32:output=fp16"] < 0.95  # the confirmation can
    assert summary["confirmation"]["fractions"]["sequential:fp32:output=fp16"] == 1.0
    assert summary["best"] == "sequential:fp32:output=fp16" and summary["fractions"] == {216: 1.0}
    assert "pairwise:fp32:output=fp16" not in summary["perfect"]


@pytest.mark.parametrize("zeros", ["signed", "positive"])
def test_the_sign_of_a_zero_result_is_measured_not_assumed(zeros):
    """A kernel that adds its sum onto a +0 output returns +0 where IEEE rounding gives -0.
    The zero-sign inputs (every product a tiny negative) ask it at every output, so the
    reported spec carries zeros=positive exactly when the op does, and is 100% either way."""
    from convprobe.identify import layer_identify

    truth = f"sequential:fp32:output=fp16:zeros={zeros}"
    layer = Layer((1, 6, 6, 12), (3, 3, 12, 8))
    observed = layer_identify.run(EmulatedBackend(truth), layers=[layer.to_dict()], seed=0)
    for _, op, entry in layer_identify.identify_observed(observed):
        summary = entry["summary"]
        assert summary["best"] is not None and parse_model(summary["best"]).zeros == zeros, (op, summary["best"])
        assert summary["stops_matching_at"] is None, (op, summary["explanation"])
        assert ("zero results are +0" in summary["explanation"]) == (zeros == "positive")


@pytest.mark.tensorflow
@pytest.mark.slow  # four identify runs, two of K = 6144 whose trees are recovered: about 3 minutes
def test_real_tensorflow_layers_are_reproduced_bit_for_bit(tmp_path):
    """onednn-off+fp16-acc at a 1x1 layer with K = 6144 and a 3x3 layer with 256 input
    channels: every op 100% at two seeds, with the same measured spec; --threads is in
    the provenance."""
    best = {}
    for seed in ("0", "1"):
        for shape, filters in (("1,4,4,6144", "1,1,6144,8"), ("1,8,8,256", "3,3,256,8")):
            doc = run_cli_json("identify", "--configs", "onednn-off+fp16-acc", "--threads", "2", "--seed", seed,
                               "--input-shape", shape, "--filter-shape", filters)
            (result,) = doc["results"]
            assert result["environment"]["TF_NUM_INTRAOP_THREADS"] == "2"
            for op, entry in doc["matches"]["tensorflow/cpu/onednn-off+fp16-acc"].items():
                assert entry["summary"]["stops_matching_at"] is None, (shape, op, entry["summary"]["explanation"])
                best.setdefault((shape, op), set()).add(entry["summary"]["best"])
    assert all(len(specs) == 1 for specs in best.values()), best
    assert best[("1,4,4,6144", "conv2d")] == {
        "splitk(length=3072, splitk(length=320, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), "
        "combine=fp16), combine=fp16)"}


@pytest.mark.tensorflow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras' own save path, not ours
def test_keras_models_identify_cannot_take_are_one_line_refusals(tmp_path):
    import keras

    einsum = keras.Sequential([keras.Input((4,)), keras.layers.EinsumDense("ab,bc->ac", output_shape=2)])
    einsum.save(tmp_path / "einsum.keras")
    inputs = keras.Input((None, None, 3))
    keras.Model(inputs, keras.layers.Conv2D(4, 3, name="free_size")(inputs)).save(tmp_path / "free.keras")
    for name, message in (("einsum.keras", "the model has no layer identify measures (Conv1D, Conv2D, "),
                          ("free.keras", "layer free_size: input shape (None, None, None, 3) has an unknown size")):
        proc = run_cli("identify", "--configs", "none", "--model", "sequential:fp16",
                       "--keras-model", str(tmp_path / name))
        lines = [line for line in proc.stderr.splitlines() if line.startswith("convprobe")]
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""


LANES2 = "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16)"
#: Columns 0-1, 2 and 3+ of the GEMM on three kernels (as Eigen's 16 / 8 / rest blocks, smaller).
BY_COLUMN = f"columns(sequential:fp16:product=fp16 * 2, {LANES2}, sequential:fp16:addition=fp32)"
#: The input gradient of 1x6x6x3 * 3x3x3x16: 27 columns (tap, channel) in blocks of 16, 8 and 3; in
#: the rotated filter's order channel 0 meets tap 8 (column 24), then taps 7 and 6 (21, 18) in the
#: block of 8; channels 1 and 2 also tap 5 (16, 17).
BY_TAP = (f"columns(splitk(length=16, sequential:fp16:product=fp16, first=sequential:fp16 | {LANES2} | {LANES2}, "
          f"combine=fp16), splitk(length=16, sequential:fp16:product=fp16, first=sequential:fp16 | {LANES2} | "
          f"{LANES2} | {LANES2}, combine=fp16))")


@pytest.mark.parametrize("op,layer,spec", [
    ("conv2d", Layer((2, 8, 8, 4), (3, 3, 4, 5)), BY_COLUMN),
    ("conv2d_backprop_filter", Layer((2, 6, 6, 4), (3, 3, 4, 5)), BY_COLUMN),
    ("conv2d", Layer((1, 6, 6, 8), (1, 1, 8, 3), strides=(2, 2)), "columns(sequential:fp32:output=fp16, "
                                                                  "sequential:fp16)"),
    ("conv2d_backprop_input", Layer((1, 6, 6, 3), (3, 3, 3, 16)), BY_TAP),
])
def test_the_columns_are_measured_one_by_one(op, layer, spec):
    """On the emulator: each column's structure is measured from rows that pass through every
    column, and the runs give back the model, spec for spec."""
    runs, note = column_patterns.measure_columns(EmulatedBackend(spec), layer, op)
    assert note == "" and len(runs) >= 2, runs
    assert column_patterns.column_models(layer, op, runs).to_spec() == parse_model(spec).to_spec()


def test_one_kernel_for_every_column_is_one_run_and_no_spec():
    for op in LAYER_OPS:
        layer = Layer((2, 6, 6, 3), (3, 3, 3, 8))  # K >= 8 in each column
        runs, note = column_patterns.measure_columns(EmulatedBackend("sequential:fp16:product=fp16"), layer, op)
        assert note == "" and [run.first for run in runs] == [0], runs
        assert runs[0].structure.lanes == 1 and runs[0].structure.products_rounded is True
        assert column_patterns.column_models(layer, op, runs) is None


def test_columns_that_cannot_be_measured_say_why():
    backend = EmulatedBackend("sequential:fp16")
    runs, note = column_patterns.measure_columns(backend, Layer((1, 2, 2, 2), (3, 3, 2, 4), padding="SAME"), "conv2d")
    assert runs == [] and "no output window lies wholly inside the image" in note
    runs, note = column_patterns.measure_columns(backend, Layer((1, 8, 8, 64), (3, 3, 64, 4)), "conv2d")
    assert runs == [] and f"over {column_patterns.MAX_CALLS}" in note  # 4 rows a call at K = 576


def test_identify_confirms_the_measured_columns():
    """identify on the emulator picks the spec measured column by column, and says so."""
    doc = run_cli_json("identify", "--configs", "none", "--model", BY_COLUMN, "--input-shape", "2,8,8,4",
                       "--filter-shape", "3,3,4,5")
    summary = doc["matches"][f"emulated/{BY_COLUMN}"]["conv2d"]["summary"]
    assert summary["best"] == parse_model(BY_COLUMN).to_spec() and summary["stops_matching_at"] is None
    assert "measured column by column: 3 runs of columns" in summary["explanation"]
    assert summary["table"]["sequential:fp16:product=fp16"] < 1.0


@pytest.mark.slow  # four identify runs at real layers: about 80 s
@pytest.mark.tensorflow
def test_real_gemm_columns_differ_by_block_and_are_measured():
    """onednn-off+fp16-acc: the first ResNet layer's input gradient (27 columns) at two seeds,
    a C = 1 layer (9 columns: its one channel's spec needs no columns(...); its forward's
    K = 9 ends in a lanes tail) and forward and
    filter gradients with 29 output channels are measured column by column, 100%; one model
    for every column is not."""
    cases = (("4,32,32,3", "3,3,3,16", ("0", "1"), ("conv2d_backprop_input",)),
             ("2,16,16,1", "3,3,1,8", ("0",), ("conv2d_backprop_input",)),
             ("2,8,8,16", "3,3,16,29", ("0",), ("conv2d", "conv2d_backprop_filter")))
    for shape, filters, seeds, ops in cases:
        for seed in seeds:
            doc = run_cli_json("identify", "--configs", "onednn-off+fp16-acc", "--seed", seed,
                               "--input-shape", shape, "--filter-shape", filters)
            for op in ops:
                summary = doc["matches"]["tensorflow/cpu/onednn-off+fp16-acc"][op]["summary"]
                assert summary["stops_matching_at"] is None, summary
                assert len(summary["structure"]["columns"]) >= 2, summary["structure"]  # kernels differ by block
                assert "measured column by column" in summary["explanation"]
                if filters == "3,3,1,8":  # K = 9: two lanes over 8 terms, the ninth after their combine
                    forward = doc["matches"]["tensorflow/cpu/onednn-off+fp16-acc"]["conv2d"]["summary"]
                    assert forward["best"].endswith("tail=1)") and forward["stops_matching_at"] is None, forward
                plain = (f"chunked:fp16:n={filters.split(',')[3]}:total=fp16:product=fp16"
                         if op == "conv2d_backprop_input" else "sequential:fp16:product=fp16")
                assert summary["table"][plain] < 0.99


@pytest.mark.parametrize("spec,innermost", [("sequential:fp16:product=fp16:positions=hwn", True),
                                            ("sequential:fp16:product=fp16", False),
                                            ("sequential:fp32:output=fp16:positions=hwn", True)])
def test_the_probe_measures_a_filter_gradient_s_position_order(spec, innermost):
    """On the emulator: B, a unit one image later and -B one column later tell (oh, ow, n)
    from (n, oh, ow), for fp16 and fp32 accumulators, and identify confirms the spec."""
    layer = Layer((2, 6, 6, 8), (3, 3, 8, 4))
    measured = layer_patterns.measure(EmulatedBackend(spec), layer, "conv2d_backprop_filter")
    assert measured.batch_innermost is innermost, measured
    doc = run_cli_json("identify", "--configs", "none", "--model", spec, "--input-shape", "2,6,6,8",
                       "--filter-shape", "3,3,8,4")
    summary = doc["matches"][f"emulated/{spec}"]["conv2d_backprop_filter"]["summary"]
    assert summary["best"] == spec and summary["stops_matching_at"] is None, summary["explanation"]
    assert layer_patterns.measure(EmulatedBackend(spec), Layer((1, 6, 6, 8), (3, 3, 8, 4)),
                                  "conv2d_backprop_filter").batch_innermost is None  # one image: no order


def test_lanes_leave_the_position_order_unmeasured():
    """Lanes part B from -B, so the order probe would misread them: not measured."""
    for spec in ("lanes(2, sequential:fp16, combine=sequential:fp16)", "lanes(4, sequential:fp32, combine=pairwise:fp32)"):
        measured = layer_patterns.measure(EmulatedBackend(spec), Layer((2, 6, 6, 8), (3, 3, 8, 4)),
                                          "conv2d_backprop_filter")
        assert measured.lanes != 1 and measured.batch_innermost is None, measured


@pytest.mark.tensorflow
def test_strict_xla_filter_gradients_sum_the_batch_innermost():
    """jit+strict at 2,16,16,8 * 3,3,8,8: XLA's filter gradient sums (oh, ow, n) in two lanes
    split at 320 terms. Lanes hide the order from the B / unit / -B probe (it reads image by
    image); measured laid out batch innermost it is 100%, and no spec of (n, oh, ow) is."""
    doc = run_cli_json("identify", "--configs", "jit+strict", "--input-shape", "2,16,16,8", "--filter-shape", "3,3,8,8",
                       "--trees", "always")  # (the tree is compared below)
    summary = doc["matches"]["tensorflow/cpu/jit+strict"]["conv2d_backprop_filter"]["summary"]
    assert summary["best"].endswith("positions=hwn)") and summary["stops_matching_at"] is None, summary["explanation"]
    assert "lanes(2," in summary["best"] and "rows laid out batch innermost" in summary["explanation"]
    assert summary["structure"]["batch_innermost"] is False and summary["structure"]["innermost"]["lanes"] == 2
    # the tree recovered over (n, oh, ow) holds the same order: it matches too; the readable spec is reported
    assert max(f for spec, f in summary["table"].items() if "positions=hwn" not in spec and "tree(" not in spec) < 0.5
    assert max(f for spec, f in summary["table"].items() if "tree(" in spec) == 1.0


def test_lanes_over_the_batch_innermost_order_are_measured_in_that_order():
    """On the emulator: lanes over (oh, ow, n) read as image by image to the order probe; the
    measurement laid out batch innermost finds the lanes, and identify confirms the spec."""
    spec = "lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16, positions=hwn)"  # 3 images: not per image
    layer = Layer((3, 6, 6, 8), (3, 3, 8, 4))
    measured = layer_patterns.measure(EmulatedBackend(spec), layer, "conv2d_backprop_filter")
    assert measured.batch_innermost is None and measured.innermost["lanes"] == 2, measured  # lanes: probe not run
    doc = run_cli_json("identify", "--configs", "none", "--model", spec, "--input-shape", "3,6,6,8",
                       "--filter-shape", "3,3,8,4")
    summary = doc["matches"][f"emulated/{spec}"]["conv2d_backprop_filter"]["summary"]
    assert summary["best"] == spec and summary["stops_matching_at"] is None, summary["explanation"]


def test_one_image_is_measured_in_one_order():
    measured = layer_patterns.measure(EmulatedBackend("sequential:fp16"), Layer((1, 6, 6, 8), (3, 3, 8, 4)),
                                      "conv2d_backprop_filter")
    assert measured.innermost is None and measured.batch_innermost is None

PADDED = Layer((8, 2, 2, 64), (3, 3, 64, 16))  # 3x3 SAME on 2x2: every output reads padding


@pytest.mark.parametrize("spec", [
    "splitk(parts=2, sequential:fp16:product=fp16, combine=fp16)",  # Eigen's K sharded over two threads
    "chunked:fp32:n=288:total=fp32:output=fp16",
    "sequential:fp16:product=fp16",
    "chunked:fp16:n=64:product=fp16",  # fp16 chunks every 64 added in fp32
    "sequential:fp32:output=fp16",
])
def test_a_layer_whose_every_output_reads_padding_is_measured_on_its_widest_window(spec):
    backend = EmulatedBackend(spec)
    measured = layer_patterns.measure(backend, PADDED, "conv2d")
    assert "in-bounds terms of output" in measured.note, measured
    specs = [*candidates.candidate_specs(measured, PADDED.k("conv2d")), *measured.derived]
    x, w = op_confirmation_inputs(PADDED, "conv2d", 3)
    truth = run_op(backend, PADDED, "conv2d", x, w)
    assert any(np.array_equal(run_op(EmulatedBackend(s), PADDED, "conv2d", x, w).view(np.uint16),
                              truth.view(np.uint16)) for s in specs), (measured, specs)


@pytest.mark.parametrize("truth,needed", [
    ("chunked:fp16:n=8:total=fp16:product=fp16", False),  # a measured spec reproduces it: no trees needed
    ("splitk(length=24, pairwise:fp16, combine=pairwise:fp16)", True),  # no measured spec does
])
def test_trees_are_recovered_where_no_measured_spec_reproduces_the_op(truth, needed):
    """`trees=needed` skips the summation trees only where a measured spec reproduces every
    output of the op on six input sets, and says so; `trees=always` recovers them anyway,
    and the reported spec is the same arithmetic either way."""
    from convprobe.identify import layer_identify

    layer = Layer((1, 6, 6, 8), (3, 3, 8, 4))
    reports = {}
    for mode in ("needed", "always"):
        observed = layer_identify.run(EmulatedBackend(truth), layers=[layer.to_dict()], seed=3, trees=mode)
        reports[mode] = {op: entry["summary"] for _, op, entry in layer_identify.identify_observed(observed)}
        if mode == "needed":
            observed_needed = observed["layers"][0]["ops"]
    for op in layer.ops:
        needed_trees, always_trees = reports["needed"][op]["trees"], reports["always"][op]["trees"]
        assert always_trees["classes"] and not always_trees["note"], (op, always_trees)
        if needed:
            assert needed_trees["classes"], (op, needed_trees)
        else:
            assert not needed_trees["classes"] and needed_trees["note"].startswith(layer_identify.NOT_NEEDED), (
                op, needed_trees)
            assert layer_identify.NOT_NEEDED in reports["needed"][op]["explanation"]
            settled = observed_needed[op]["settled"]
            assert settled and reports["needed"][op]["best"] == settled, (op, settled, reports["needed"][op]["best"])
        for mode in reports:
            summary = reports[mode][op]
            assert summary["stops_matching_at"] is None, (op, mode, summary["explanation"])
            assert summary["confirmation"]["fractions"][summary["best"]] == 1.0, (op, mode)
        assert layer_identify._same_arithmetic(reports["needed"][op]["best"], reports["always"][op]["best"],
                                               layer, op, 3), (op, reports["needed"][op]["best"])


@pytest.mark.parametrize("backend_spec, settled", [
    ("sequential:fp32:output=fp16:zeros=positive", "sequential:fp32:output=fp16:zeros=positive"),
    ("sequential:fp32:output=fp16", "sequential:fp32:output=fp16"),
    ("sequential:fp16", None),
])
def test_a_settling_spec_takes_positive_zeros_only_where_the_op_answers_with_them(backend_spec, settled):
    """The settling check on a backend that adds its sum onto a +0 output: the structure's
    spec (-0 where its sum is -0) settles the op only with ``zeros=positive``, a backend with
    -0 settles it as it is, and another arithmetic settles nothing."""
    layer, op, seed = Layer((1, 4, 4, 8), (3, 3, 8, 2)), "conv2d", 3
    backend = EmulatedBackend(backend_spec)
    drawn = {name: make(layer, op, seed) for name, make in INPUT_SETS.items()}
    outputs = dict(zip(drawn, run_ops(backend, layer, op, list(drawn.values()))))
    signs = outputs["zero_sign"].view(np.uint16)
    zero = 0 if "zeros=positive" in backend_spec else 0x8000  # the zero-sign inputs' zero sums: +0 or -0
    assert (signs == zero).any()
    structure = Structure(derived=("sequential:fp32:output=fp16",))
    got = _settling_spec(backend, layer, op, structure, drawn, outputs, seed)
    assert got == (None if settled is None else parse_model(settled).to_spec()), got
