"""An input gradient measured as the forward conv of dy with the rotated filter (XLA's GEMM)."""

import numpy as np
import pytest

from convprobe.backends.emulated import EmulatedBackend
from convprobe.identify import layer_patterns
from convprobe.identify.input_gradient_layout import AsForward, forward_layer
from convprobe.probes.layers import Layer

from conftest import run_cli_json

#: Strict XLA's input gradient at 1,6,6,18 * 2,2,18,21 VALID, as identify measured it there.
BY_CHANNEL = "columns(sequential:fp16:product=fp16 * 16, sequential:fp16:addition=fp32)"


@pytest.mark.parametrize("layer", [Layer((1, 6, 6, 18), (2, 2, 18, 21), padding="VALID"),
                                   Layer((2, 5, 7, 3), (3, 3, 3, 4)),
                                   Layer((1, 9, 9, 2), (3, 3, 2, 5), dilation=(2, 2))])
def test_the_forward_conv_is_the_layers_input_gradient(layer):
    """conv2d on forward_layer through AsForward equals the emulator's own conv2d there, bit
    for bit, on a model that picks by column (so a wrong filter transpose would show)."""
    forward = forward_layer(layer)
    assert forward.output_shape == layer.input_shape
    rng = np.random.default_rng(7)
    x = rng.standard_normal(forward.input_shape).astype(np.float16)
    w = rng.standard_normal(forward.filter_shape).astype(np.float16)
    backend = EmulatedBackend("columns(sequential:fp16:product=fp16 * 2, lanes(2, sequential:fp16, "
                              "combine=sequential:fp16))")
    np.testing.assert_array_equal(np.asarray(AsForward(backend, layer).conv2d(x, w, **forward.conv_args)).view(np.uint16),
                                  np.asarray(backend.conv2d(x, w, **forward.conv_args)).view(np.uint16))


def test_a_strided_input_gradient_has_no_forward_layer():
    assert forward_layer(Layer((1, 8, 8, 4), (3, 3, 4, 4), strides=(2, 2))) is None
    measured = layer_patterns.measure(EmulatedBackend("sequential:fp16"), Layer((1, 8, 8, 4), (3, 3, 4, 4), strides=(2, 2)),
                                      "conv2d_backprop_input")
    assert measured.as_forward is None


def test_columns_over_input_channels_are_found_as_the_forward_conv():
    """BY_CHANNEL sums whole-K chains per input channel, which col2im's (tap, channel)
    columns cannot give: identify finds it through the forward layout and says so."""
    doc = run_cli_json("identify", "--configs", "none", "--model", BY_CHANNEL, "--input-shape", "1,6,6,18",
                       "--filter-shape", "2,2,18,21", "--padding", "VALID")
    summary = doc["matches"][f"emulated/{BY_CHANNEL}"]["conv2d_backprop_input"]["summary"]
    assert summary["best"] == BY_CHANNEL and summary["stops_matching_at"] is None, summary["explanation"]
    assert "forward conv of dy" in summary["explanation"]
    assert [run["first"] for run in summary["structure"]["as_forward"]["columns"]] == [0, 16]


@pytest.mark.tensorflow
def test_strict_xla_computes_the_input_gradient_as_a_forward_conv():
    """jit+strict at 1,6,6,18 * 2,2,18,21 VALID: 100% as columns over the input channels;
    no col2im-measured spec matches (the best matched 96.5% before this layout was measured)."""
    doc = run_cli_json("identify", "--configs", "jit+strict", "--input-shape", "1,6,6,18", "--filter-shape", "2,2,18,21",
                       "--padding", "VALID")
    summary = doc["matches"]["tensorflow/cpu/jit+strict"]["conv2d_backprop_input"]["summary"]
    # strict XLA lands each sum on a +0 output (the zero-sign inputs show it): BY_CHANNEL with zeros=positive
    assert summary["best"] == BY_CHANNEL[:-1] + ", zeros=positive)", summary["explanation"]
    assert summary["stops_matching_at"] is None, summary["explanation"]
    assert summary["table"]["sequential:fp16:product=fp16"] < 1.0  # col2im's best: one chain for every column


def test_a_strided_input_gradient_tries_its_one_kernel_over_the_whole_k():
    """A strided input gradient carries no crafted rows; where its (tap, channel) columns
    share one kernel, that kernel's model over the whole K (zeros included) is tried."""
    spec = "sequential:fp32:product=fp16:output=fp16"
    doc = run_cli_json("identify", "--configs", "none", "--model", spec, "--input-shape", "1,12,12,4",
                       "--filter-shape", "4,4,4,9", "--strides", "4")
    summary = doc["matches"][f"emulated/{spec}"]["conv2d_backprop_input"]["summary"]
    assert summary["best"] == spec and summary["stops_matching_at"] is None, summary["explanation"]
    assert spec in summary["structure"]["derived"]


@pytest.mark.tensorflow
def test_strict_xla_rounds_products_and_sums_in_fp32_where_stride_equals_the_kernel():
    """jit+strict at 1,12,12,4 * 4,4,4,33 stride 4: XLA's conv of the dilated dy rounds each
    product to fp16 and sums in fp32 (the one-tap chunks matched 94.4% before)."""
    doc = run_cli_json("identify", "--configs", "jit+strict", "--input-shape", "1,12,12,4", "--filter-shape",
                       "4,4,4,33", "--strides", "4")
    summary = doc["matches"]["tensorflow/cpu/jit+strict"]["conv2d_backprop_input"]["summary"]
    assert summary["best"] == "sequential:fp32:product=fp16:output=fp16", summary["explanation"]
    assert summary["stops_matching_at"] is None
    # (fp32 totals: the canonical spelling drops them; its exact products reach the output's rounding, where
    # strict XLA's +0 output shows: zeros=positive)
    assert summary["table"]["chunked:fp32:n=33:output=fp16:zeros=positive"] < 1.0
