"""The direct-sum probe: direct convolutions pass both tests, Winograd and FFT ones fail.

The transform convolutions below are real algorithms, written from their definitions
(Lavin and Gray, CVPR 2016, for Winograd's F(m x m, 3 x 3) matrices; NumPy's pocketfft
in single precision for the FFT), and checked to compute the convolution before they
are used. They stand for what cuDNN's WINOGRAD and FFT algorithms do on a GPU.
"""

from fractions import Fraction as F

import numpy as np
import pytest

from convprobe.backends.base import AbstractBackend
from convprobe.backends.emulated import EmulatedBackend
from convprobe.probes import direct_sum, layer_identify
from convprobe.probes.layers import LAYER_OPS, Layer, run_op
from conftest import run_cli_json

#: (B^T, G, A^T) of F(m, 3) for m = 2 and 4 (Lavin and Gray 2016, section 4.1 and 4.2).
WINOGRAD = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [F(1, 2), F(1, 2), F(1, 2)], [F(1, 2), F(-1, 2), F(1, 2)], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[F(1, 4), 0, 0], [F(-1, 6), F(-1, 6), F(-1, 6)], [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)], [F(1, 24), F(-1, 12), F(1, 6)], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


class WinogradBackend(AbstractBackend):
    """F(m x m, 3 x 3), stride 1, VALID: transforms computed in fp32 and stored in
    `storage` (fp16 as an fp16 kernel does, or fp64 to check the algebra), the
    per-element GEMM over channels in fp32."""

    name = "winograd"

    def __init__(self, m: int, storage=np.float16):
        self.m, self.storage = m, storage
        self.bt, self.g, self.at = (np.array([[float(v) for v in row] for row in mat]) for mat in WINOGRAD[m])

    def _round(self, a):
        return a.astype(self.storage).astype(np.float64 if self.storage == np.float64 else np.float32)

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        assert padding == "VALID" and strides in (1, (1, 1)) and dilation in (1, (1, 1)) and w.shape[:2] == (3, 3)
        m, t = self.m, self.m + 2
        n, h, wd, c = x.shape
        oh, ow = h - 2, wd - 2
        assert oh % m == 0 and ow % m == 0, "the output must tile exactly"
        v = self._round(np.einsum("ai,ijco,bj->abco", self.g, w.astype(np.float64), self.g))
        tiles = np.stack([np.stack([x[:, i:i + t, j:j + t, :] for j in range(0, ow, m)], 1)
                          for i in range(0, oh, m)], 1).astype(np.float64)  # (n, ti, tj, t, t, c)
        u = self._round(np.einsum("ai,nxyijc,bj->nxyabc", self.bt, tiles, self.bt))
        mm = self._round(np.einsum("nxyabc,abco->nxyabo", u, v))
        y = np.einsum("ai,nxyijo,bj->nxyabo", self.at, mm.astype(np.float64), self.at)
        return y.transpose(0, 1, 3, 2, 4, 5).reshape(n, oh, ow, -1).astype(self.storage)


class FFTBackend(AbstractBackend):
    """Correlation through 2-D FFTs over the image, stride 1, VALID, in `dtype`."""

    name = "fft"

    def __init__(self, dtype=np.float32):
        self.dtype = dtype

    def conv2d(self, x, w, *, strides=1, padding="VALID", dilation=1):
        assert padding == "VALID" and strides in (1, (1, 1)) and dilation in (1, (1, 1))
        n, h, wd, c = x.shape
        kh, kw = w.shape[:2]
        xf = np.fft.rfft2(x.astype(self.dtype), axes=(1, 2))
        flipped = np.zeros((h, wd, *w.shape[2:]), self.dtype)
        flipped[:kh, :kw] = w[::-1, ::-1].astype(self.dtype)
        wf = np.fft.rfft2(flipped, axes=(0, 1))
        y = np.fft.irfft2(np.einsum("nijc,ijco->nijo", xf, wf), s=(h, wd), axes=(1, 2))
        return y[:, kh - 1:, kw - 1:, :]


TRANSFORM_LAYER = Layer((1, 10, 10, 16), (3, 3, 16, 8), padding="VALID")


@pytest.mark.parametrize("backend", [WinogradBackend(2, np.float64), WinogradBackend(4, np.float64),
                                     FFTBackend(np.float64)], ids=["F(2,3)", "F(4,3)", "FFT"])
def test_the_transform_convolutions_compute_the_convolution(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 10, 10, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    def direct(a, b):
        return sum(np.einsum("nhwc,co->nhwo", a[:, i:i + 8, j:j + 8].astype(np.float64), b[i, j].astype(np.float64))
                   for i in range(3) for j in range(3))

    # fp64 rounding of sums of |x||w| terms, times the transforms' growth (entries up to 8, 6 x 6 tiles): 2**12
    bound = 2.0 ** 12 * np.finfo(np.float64).eps * direct(np.abs(x), np.abs(w))
    assert np.all(np.abs(backend.conv2d(x, w) - direct(x, w)) <= bound)


LAYERS = [Layer((1, 8, 8, 16), (3, 3, 16, 8)), Layer((2, 9, 9, 6), (3, 3, 6, 10), strides=(2, 2)),
          Layer((1, 9, 9, 4), (3, 3, 4, 5), dilation=(2, 2), padding="VALID"), Layer((1, 4, 4, 64), (1, 1, 64, 8)),
          Layer((2, 7, 5, 3), (2, 4, 3, 6), strides=(2, 3))]
DIRECT_MODELS = ["sequential:fp16", "chunked:fp32:n=16:total=fp32:output=fp16",
                 "splitk(length=40, lanes(2, sequential:fp16:product=fp16, combine=sequential:fp16), combine=fp16)",
                 "sequential:fp16:rounding=stochastic:seed=3", "a100"]


@pytest.mark.parametrize("spec", DIRECT_MODELS)
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.label)
def test_every_emulated_model_is_a_direct_sum(spec, layer):
    for op in LAYER_OPS:
        found = direct_sum.probe(EmulatedBackend(spec), layer, op)
        assert found.direct is True and found.outputs > 0, (op, found)


def test_a_tap_that_reads_every_input_is_tested_by_rescaling_alone():
    found = direct_sum.probe(EmulatedBackend("sequential:fp16"), Layer((1, 4, 4, 64), (1, 1, 64, 8)),
                             "conv2d_backprop_filter")
    assert found.direct is True and found.outputs == 64 * 8 and found.outside_outputs == 0, found
    assert "0 by other inputs" in found.reason


class LeakyBackend(EmulatedBackend):
    """A direct sum plus 2**-6 times the mean of the whole first operand: every output
    reads every input (the shape of an FFT's leak), for all three ops."""

    def _leak(self, y, first):
        return (np.asarray(y, np.float64) + np.mean(first.astype(np.float64)) / 64).astype(np.float16)

    def conv2d(self, x, w, **kwargs):
        return self._leak(super().conv2d(x, w, **kwargs), x)

    def conv2d_backprop_input(self, dy, w, input_shape, **kwargs):
        return self._leak(super().conv2d_backprop_input(dy, w, input_shape, **kwargs), dy)

    def conv2d_backprop_filter(self, x, dy, filter_shape, **kwargs):
        return self._leak(super().conv2d_backprop_filter(x, dy, filter_shape, **kwargs), x)


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer.filter_shape[:2] != (1, 1)],
                         ids=lambda layer: layer.label)
def test_a_leak_from_outside_the_window_is_seen_in_every_op(layer):
    for op in LAYER_OPS:
        found = direct_sum.probe(LeakyBackend("exact:fp64:output=fp16"), layer, op)
        assert found.direct is False and found.changed_by_outside > 0, (op, found)


class NoisyBackend(EmulatedBackend):
    """A direct sum whose last bit is random on every call (an atomic split-K's shape)."""

    rng = np.random.default_rng(5)

    def conv2d(self, x, w, **kwargs):
        y = np.asarray(super().conv2d(x, w, **kwargs), np.float16)
        return (y.view(np.uint16) ^ self.rng.integers(0, 2, y.shape, dtype=np.uint16)).view(np.float16)


def test_a_nondeterministic_op_is_not_judged():
    found = direct_sum.probe(NoisyBackend("sequential:fp16"), LAYERS[0], "conv2d")
    assert found.direct is None and "nondeterministic" in found.note, found


@pytest.mark.parametrize("backend,by_rescaling,by_outside", [
    (WinogradBackend(2), True, False),  # local: each output's transformed terms are its own window's
    (WinogradBackend(4), True, True),
    (FFTBackend(), None, True),  # fp32 rounding is finer than fp16 outputs show; large outside values are not
], ids=["F(2,3)", "F(4,3)", "FFT fp32"])
def test_a_transform_convolution_is_not_a_direct_sum(backend, by_rescaling, by_outside):
    found = direct_sum.probe(backend, TRANSFORM_LAYER, "conv2d")
    assert found.direct is False, found
    assert by_rescaling is None or (found.changed_by_rescaling > 0) == by_rescaling, found
    assert (found.changed_by_outside > 0) == by_outside, found
    assert "not a direct sum" in found.reason


def test_identify_says_so_rather_than_fit_a_model():
    """identify's summary for a Winograd conv: no best model, and why."""
    observed = layer_identify.run(WinogradBackend(4), layers=[TRANSFORM_LAYER.to_dict()])
    (_, op, entry), = [found for found in layer_identify.identify_observed(observed) if found[1] == "conv2d"]
    summary = entry["summary"]
    assert summary["best"] is None and summary["stops_matching_at"] == TRANSFORM_LAYER.k("conv2d"), summary
    assert summary["direct"]["direct"] is False
    assert summary["explanation"].startswith("not a direct sum of products"), summary["explanation"]
    assert summary["table"], "the models tried are still reported"
    assert observed["layers"][0]["ops"]["conv2d"]["structure"]["accumulator"]  # measured, but not counted:
    assert layer_identify.interpret(observed)["accumulation"] == "unknown"


@pytest.mark.tensorflow
def test_tensorflow_cpu_convolutions_are_direct_sums():
    from convprobe.backends.tensorflow import TensorFlowBackend

    backend = TensorFlowBackend("cpu")
    for layer in LAYERS:
        for op in LAYER_OPS if layer.dilation == (1, 1) else ["conv2d"]:  # eager gradients refuse dilation
            found = direct_sum.probe(backend, layer, op)
            assert found.direct is True, (layer.label, op, found)


@pytest.mark.tensorflow
def test_the_layer_map_records_the_evidence():
    doc = run_cli_json("identify", "--configs", "jit+strict", "--input-shape", "1,6,6,4", "--filter-shape", "3,3,4,8")
    for op in LAYER_OPS:
        summary = doc["matches"]["tensorflow/cpu/jit+strict"][op]["summary"]
        assert summary["direct"]["direct"] is True and summary["direct"]["outputs"] > 0, (op, summary["direct"])


def test_the_winograd_fixture_rounds_in_fp16():
    """Sanity for the fixture itself: in fp16 it differs from the exact result somewhere."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (1, 10, 10, 16)).astype(np.float16)
    w = rng.uniform(-1, 1, (3, 3, 16, 8)).astype(np.float16)
    exact = run_op(EmulatedBackend("exact:fp64:output=fp16"), TRANSFORM_LAYER, "conv2d", x, w)
    assert np.any(WinogradBackend(4).conv2d(x, w) != exact)
