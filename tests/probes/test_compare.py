"""Real fp16 vs fake fp16 (fp32 compute then cast), on real TensorFlow and the emulator."""

import numpy as np
import pytest

from conftest import rows_by_label
from convprobe.analysis import gamma
from convprobe.probes import compare
from convprobe.probes.reference import conv2d_float64


def test_reference_conv_matches_a_direct_loop():
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 5, 6, 3)), rng.standard_normal((3, 2, 3, 4))
    expected = np.zeros((2, 3, 5, 4))
    for n, i, j, o in np.ndindex(expected.shape):
        expected[n, i, j, o] = sum(x[n, i + a, j + b, c] * w[a, b, c, o] for a in range(3) for b in range(2) for c in range(3))
    # einsum and the loop sum in different orders: float64 agreement to K*u*sum|xw| (gamma bound).
    bound = 2 * gamma(18, 2.0**-53) * conv2d_float64(np.abs(x), np.abs(w))  # both orders err
    assert np.all(np.abs(conv2d_float64(x, w) - expected) <= bound)


def test_inputs_are_seeded_fp16_uniform():
    a = compare.inputs(3, 2, 4, 4, 2, 2, 3)
    b = compare.inputs(3, 2, 4, 4, 2, 2, 3)
    assert a[0].dtype == np.float16 and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert 0.0 <= a[0].min() and a[0].max() <= 1.0


@pytest.mark.tensorflow
def test_tensorflow_default_real_equals_fake_bit_for_bit(compare_all):
    row = rows_by_label(compare_all)["tensorflow/cpu/default"]
    obs = row["observed"]
    assert obs["shapes"] == {"x": [16, 32, 32, 16], "w": [3, 3, 16, 16], "y": [16, 30, 30, 16]}
    assert obs["real_dtype"] == "float16"
    assert obs["fraction_different"] == 0.0 and obs["max_abs_diff"] == 0.0
    assert row["verdict"] == "identical to fp32 compute then cast" and row["accumulation"] == "fp32"
    assert obs["fake"]["max_ulp_error"] <= obs["fp32_bound_max_ulp"]


@pytest.mark.tensorflow
def test_tensorflow_fp16_accumulation_differs_with_larger_ulp_error(compare_all):
    rows = rows_by_label(compare_all)
    fp16, fp32 = rows["tensorflow/cpu/fp16"]["observed"], rows["tensorflow/cpu/fp32"]["observed"]
    assert fp16["fraction_different"] > 0.5
    # fp32 accumulation then one rounding: within 0.5 ulp plus gamma_K(2**-24) sum|x w| / ulp(ref);
    # inputs in [0, 1] make sum|x w| = |ref| < 2**11 ulp(ref) in fp16, K = 3*3*16.
    k, u32 = 3 * 3 * 16, 2.0**-24
    assert fp32["real"]["max_ulp_error"] <= fp32["fp32_bound_max_ulp"] <= 0.5 + k * u32 / (1 - k * u32) * 2**11
    # fp16 accumulation's error is beyond anything fp32 accumulation can explain
    assert fp16["real"]["max_ulp_error"] > fp16["fp32_bound_max_ulp"]
    assert fp16["real"]["max_ulp_error"] <= fp16["fp16_bound_max_ulp"]
    assert rows["tensorflow/cpu/fp16"]["accumulation"] == "fp16"
    assert rows["tensorflow/cpu/fp16"]["verdict"] == "differs: accumulation below fp32"


@pytest.mark.tensorflow
def test_emulated_models_behave_like_their_arithmetic(compare_all):
    rows = rows_by_label(compare_all)
    fp16, fp32 = rows["emulated/sequential:fp16"], rows["emulated/sequential:fp32"]
    assert fp16["accumulation"] == "fp16" and fp16["observed"]["fraction_different"] > 0.5
    assert fp32["accumulation"] == "fp32"
    assert fp32["observed"]["real"]["max_ulp_error"] <= fp32["observed"]["fp32_bound_max_ulp"]
