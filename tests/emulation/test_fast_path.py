"""The specialised kernels (sequential, exact) equal the general kernel bit for bit."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from convprobe import emulation as em
from convprobe.emulation import _kernels as K
from convprobe.emulation import _native_fp16
from convprobe.emulation.models import kernel_config
from convprobe.formats import BF16, FP8_E5M2, FP16, FP32, custom_format

from .conftest import assert_same_bits, fp16_arrays

def gemm(model, x, w, *, fast: bool) -> np.ndarray:
    """The model's reductions of the rows of x (M, K) against w (K, N) through the kernel
    dispatcher, specialised kernels allowed (fast) or the general kernel forced."""
    a = np.ascontiguousarray(np.asarray(x, np.float64))
    b = np.ascontiguousarray(np.asarray(w, np.float64))
    out = np.empty((a.shape[0], b.shape[1]))
    fp, ic, seed = kernel_config(model)
    K.gemm(a, b, fp, ic, seed, out, 0, inputs_fp16=True, fast=fast)
    return out


FAST_MODELS = [  # sequential, chunked and exact models the specialised kernels take
    em.Sequential(FP16),
    em.Sequential(FP16, rounding="toward_zero"),
    em.Sequential(FP16, rounding="stochastic", seed=4),
    em.Sequential(FP16, addition=FP32),
    em.Sequential(FP16, addition="fp64"),
    em.Sequential(FP16, product=FP16, subnormals="flush"),
    em.Sequential(FP16, overflow="saturate", output=FP32),
    em.Sequential(FP32),
    em.Sequential(BF16, rounding="stochastic", seed=2),
    em.Sequential(FP8_E5M2),
    em.Sequential("fp64"),
    em.Sequential("fp64", overflow="saturate"),
    em.Sequential(custom_format(9, 6, subnormals=False)),
    em.parse_model("exact:fp32"),
    em.parse_model("exact:fp16:rounding=toward_zero"),
    em.parse_model("exact:bf16:rounding=stochastic:seed=3"),
    em.parse_model("exact:fp64:output=fp32"),
    em.parse_model("exact:fp16:subnormals=flush:overflow=saturate"),
    em.parse_model("chunked:fp16:n=5"),
    em.parse_model("chunked:fp16:n=3:total=fp16:rounding=toward_zero"),
    em.parse_model("chunked:bf16:n=4:rounding=stochastic:seed=5"),
    em.parse_model("chunked:fp16:n=7:total=fp64:addition=fp32"),
    em.parse_model("chunked:fp16:n=2:product=fp16:overflow=saturate"),
    # fp16 accumulators beside those the constant-fp16 kernels take (`accumulates_fp16`)
    em.parse_model("chunked:fp16:n=6:total=fp16:rounding=stochastic:seed=7"),
    em.parse_model("sequential:fp16:rounding=toward_zero:overflow=saturate"),
    em.parse_model("sequential:fp16:rounding=stochastic:subnormals=flush:seed=8"),
]

@pytest.mark.parametrize("model", FAST_MODELS, ids=lambda m: m.to_spec())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=fp16_arrays((6, 12)), w=fp16_arrays((12, 5)))
def test_fast_kernels_equal_general_kernel(model, x, w):
    with np.errstate(all="ignore"):
        assert_same_bits(gemm(model, x, w, fast=True), gemm(model, x, w, fast=False))


@pytest.mark.parametrize("model", FAST_MODELS[:4] + [em.parse_model("exact:fp32"),
                                                     em.parse_model("exact:fp16:rounding=stochastic:seed=1"),
                                                     em.parse_model("chunked:fp16:n=2")],
                         ids=lambda m: m.to_spec())
def test_fast_kernels_propagate_inf_and_nan(model):
    # windows of 3: +inf alone, -inf alone, -inf with NaN, NaN alone, and finite overflow
    x = np.array([1.0, np.inf, 2.0, 3.0, -np.inf, np.nan, 2.0, 65504.0], dtype=np.float16).reshape(1, 1, 8, 1)
    w = np.array([1.0, 1.0, 0.5], dtype=np.float16).reshape(1, 3, 1, 1)
    with np.errstate(all="ignore"):
        fast = em.conv2d(x, w, model)
        want = em.oracle.conv2d(x, w, model)
        rows = np.stack([x.ravel()[i:i + 3] for i in range(6)])  # the conv's patches, as a GEMM
        general = gemm(model, rows, w.reshape(3, 1), fast=False)
    assert_same_bits(fast, want)
    assert_same_bits(fast.reshape(6, 1), general.astype(fast.dtype))  # the model rounds to fp16 already


@pytest.mark.parametrize("model", [em.Sequential(FP16), em.Sequential(FP16, subnormals="flush"),
                                   em.Sequential(FP16, addition=FP32)],
                         ids=lambda m: m.to_spec())
def test_fp16_direct_kernel_equals_round_to_odd_kernel(model):
    """The one-add fp16 kernel (taken for fp16 inputs) against the round-to-odd kernel
    (taken for the same values stored as float32): 300k terms of mixed magnitudes,
    biased towards the cases the kernel's proof is about (|p| << |s| and |s| << |p|).
    (Toward zero is deliberately not in the direct kernel: hypothesis found s = 32.03,
    p tiny negative, where float64 rounds s + p back to s.)"""
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 0x7C00, size=(1, 1, 600, 64), dtype=np.uint16)
    bits |= (rng.integers(0, 2, size=bits.shape, dtype=np.uint16) << 15)
    x = bits.view(np.float16)
    w = rng.integers(0x0001, 0x7C00, size=(1, 1, 64, 8), dtype=np.uint16)
    w |= (rng.integers(0, 2, size=w.shape, dtype=np.uint16) << 15)
    w = w.view(np.float16)
    with np.errstate(over="ignore"):
        direct = em.conv2d(x, w, model)
        via_odd = em.conv2d(x.astype(np.float32), w.astype(np.float32), model)
    assert_same_bits(direct, via_odd)


def test_toward_zero_counterexample_to_a_single_float64_add():
    """s = 32 + 2**-5 (fp16), p = -(2**-24)**2: truncating s + p gives 32, but float64
    rounds s + p to s first. The engine must give 32."""
    a = np.array([1.0, 2.0**-24], dtype=np.float16)
    b = np.array([32.03125, -(2.0**-24)], dtype=np.float16)
    model = em.Sequential(FP16, rounding="toward_zero")
    assert em.dot(a, b, model) == np.float16(32.0)
    x = a.reshape(1, 1, 2, 1)
    assert em.conv2d(x, b.reshape(1, 2, 1, 1), model).item() == 32.0
    assert em.oracle.dot(a, b, model) == np.float16(32.0)


@pytest.mark.parametrize("spec", ["exact:fp32", "exact:fp16:rounding=toward_zero"])
def test_exact_kernel_carries_over_long_sums(spec):
    """K = 40,000 > 2**14 terms between the fixed-point kernel's carries: huge products that
    cancel, tiny ones (2**-48) that survive only in the low word, and every sign mix."""
    rng = np.random.default_rng(7)
    k = 40_000
    big = rng.choice([65504.0, -65504.0, 2.0**-24, -(2.0**-24), 1.0, -0.5], size=(3, k))
    w = rng.choice([65504.0, -65504.0, 2.0**-24, 3.0, -1.0], size=(k, 2))
    model = em.parse_model(spec)
    assert_same_bits(gemm(model, big, w, fast=True), gemm(model, big, w, fast=False))
    assert_same_bits(gemm(model, big[:, :1], w[:1], fast=True), gemm(model, big[:, :1], w[:1], fast=False))


@pytest.mark.parametrize("spec", ["exact:fp32", "exact:fp16:rounding=toward_zero", "exact:fp64:output=fp32"])
def test_exact_kernel_sums_no_terms_to_zero(spec):
    """K = 0 (an empty lane or range of a composite): +0 for every output, as the general
    kernel gives, not whatever the kernel's scratch memory held."""
    model = em.parse_model(spec)
    empty_a, empty_w = np.zeros((70, 0)), np.zeros((0, 3))
    assert_same_bits(gemm(model, empty_a, empty_w, fast=True), np.zeros((70, 3)))
    assert_same_bits(gemm(model, empty_a, empty_w, fast=False), np.zeros((70, 3)))


def test_exact_kernel_keeps_the_last_bit_of_the_longest_sums():
    """2**16 products of 2**30 (2**46 in all), the half-unit 2**22 of fp32 there, and one
    product of 2**-8 or 2**-12 (a different sign in the last row): the tie that bit breaks
    survives only if the float64 head and tail sums of the exact kernel are exact, up to
    their block length and split point."""
    k = 1 << 16
    rows = np.full((3, k + 2), 2.0**15)
    rows[:, k] = 2.0**11
    rows[:, k + 1] = [2.0**-12, 2.0**-8, -(2.0**-8)]
    rows[:, [5, k + 1]] = rows[:, [k + 1, 5]]  # (the tiny product among the first block's large ones)
    w = np.full((k + 2, 1), 2.0**15)
    w[[k, 5]] = [[2.0**11], [1.0]]
    model = em.parse_model("exact:fp32")
    expected = np.array([[2.0**46 + 2.0**23], [2.0**46 + 2.0**23], [2.0**46]])
    assert_same_bits(gemm(model, rows, w, fast=True), expected)
    assert_same_bits(gemm(model, rows, w, fast=False), expected)
    # a block of 2**12 - 2 products of 5 * 2**-7 (159.92...), fp32's half-unit 2**-17 there,
    # and 2**-48 last: the tails' sum must keep it (at a coarser split it is near 2**7 by then)
    n = (1 << 12) - 2
    row = np.concatenate([np.full(n, 5 * 2.0**-7), [2.0**-17, 2.0**-24]])
    column = np.concatenate([np.ones(n + 1), [2.0**-24]])[:, None]
    for fast in (True, False):
        assert_same_bits(gemm(model, row[None], column, fast=fast), np.array([[n * 5 * 2.0**-7 + 2.0**-16]]))
    for k in (n + 1, n + 2, n + 3, n + 4, n + 5):  # every term counted, in one block and across two
        assert_same_bits(gemm(model, np.ones((1, k)), np.ones((k, 1)), fast=True), np.array([[float(k)]]))


@pytest.mark.parametrize("spec", ["sequential:fp32", "sequential:fp16", "sequential:bf16", "pairwise:fp32",
                                  "pairwise:fp16", "pairwise:bf16"])
def test_sum_terms_equals_the_general_kernel_over_rows(spec):
    """How composites reduce their partial results (`sum_terms`, (P, R) terms): the
    nearest-even sequential GEMM and pairwise-tree kernels vectorised across r, bit for
    bit the general kernel over the rows, for odd and even P, R across the tile,
    overflow, ties, cancellation, an inf and inf - inf."""
    model = em.parse_model(spec)
    fp, ic, seed = kernel_config(model)
    rng = np.random.default_rng(5)
    for p in (1, 2, 3, 7, 8):
        r = 2 * K.TILE + 5
        terms = (rng.standard_normal((p, r)) * rng.choice([2.0**-20, 1.0, 2.0**14], size=(p, r))).astype(np.float32)
        terms[:, 0] = [65504.0] * p  # overflows fp16 from p = 2
        terms[:, 1] = [2.0**11, 1.0, -(2.0**11)][:p] + [0.0] * max(p - 3, 0)
        terms = terms.astype(np.float64)
        terms[0, 2] = np.inf
        terms[:, 3] = [np.inf, -np.inf][:p] + [1.0] * max(p - 2, 0)
        got = np.empty(r)
        with np.errstate(invalid="ignore"):
            K.sum_terms(terms, fp, ic, np.uint64(seed), got)
        rows = np.ascontiguousarray(terms.T)
        want = np.empty(r)
        K.reduce_pairs(rows, np.ones_like(rows), fp, ic, np.uint64(seed), want)
        assert_same_bits(got, want)
        assert np.isinf(got[2]) and (p < 2 or np.isnan(got[3]))


@pytest.mark.skipif(not _native_fp16.available(fma=False), reason="no F16C (or CONVPROBE_NATIVE_FP16=0)")
@pytest.mark.parametrize("spec", ["sequential:fp16", "sequential:fp16:subnormals=flush", "sequential:fp16:addition=fp32",
                                  "sequential:fp16:addition=fp32:subnormals=flush"])
def test_direct_kernel_on_fp16_bit_patterns_equals_the_general_kernel(spec):
    """The direct kernel on float16 carriers (uint16 views, converted by F16C) against the
    general kernel on float64, whatever the CPU's fp16 FMA: every finite fp16 magnitude of
    both signs, so sums overflow and land among the subnormals."""
    from convprobe.emulation._kernels_fast import reduce_gemm_fp16_direct

    model = em.parse_model(spec)
    rng = np.random.default_rng(7)
    bits = rng.integers(1, 0x7C00, size=(67, 23), dtype=np.uint16) | (rng.integers(0, 2, (67, 23), np.uint16) << 15)
    a = bits.view(np.float16)
    a[:9] = np.float16(2.0**-20)  # rows whose sums stay subnormal
    w = rng.integers(0x0001, 0x4800, size=(23, 6), dtype=np.uint16).view(np.float16)  # up to 8: sums overflow
    half = np.empty((67, 9), np.float16)
    with np.errstate(all="ignore"):
        reduce_gemm_fp16_direct(a.view(np.uint16), w.astype(np.float64), model.subnormals == "keep",
                                model.addition == FP32, half.view(np.uint16), 2)
        general = gemm(model, a, w, fast=False).astype(np.float16)  # (fp16 values and infinities: exact)
    assert_same_bits(half[:, 2:8], general)
    assert np.isinf(half[:, 2:8]).any() and (np.abs(half[:9, 2:8]) < 2.0**-14).all()


@pytest.mark.parametrize("spec", ["exact:fp32", "exact:fp16:rounding=toward_zero", "exact:bf16:rounding=stochastic:seed=3",
                                  "exact:fp16:subnormals=flush:overflow=saturate"])
def test_exact_kernel_on_float32_carriers_equals_it_on_float64(spec):
    """fp16 inputs' products are float32 numbers, so the exact kernel on float32 arrays
    (`fp32_carriers`) changes no bit: every finite fp16 magnitude, overflow, an inf and
    a NaN among the inputs."""
    model = em.parse_model(spec)
    fp, ic, seed = kernel_config(model)
    assert K.fp32_carriers(fp, ic, True) and not K.fp32_carriers(fp, ic, False)
    rng = np.random.default_rng(5)
    bits = rng.integers(1, 0x7C00, size=(70, 19), dtype=np.uint16) | (rng.integers(0, 2, (70, 19), np.uint16) << 15)
    a = bits.view(np.float16).astype(np.float64)
    a[3, 4], a[5, 6] = np.inf, np.nan
    w = rng.integers(0x0001, 0x4800, size=(19, 4), dtype=np.uint16).view(np.float16).astype(np.float64)
    narrow, wide = np.empty((70, 4), np.float32), np.empty((70, 4))
    with np.errstate(all="ignore"):
        K.gemm(a.astype(np.float32), w.astype(np.float32), fp, ic, seed, narrow, 0, inputs_fp16=True)
        K.gemm(a, w, fp, ic, seed, wide, 0, inputs_fp16=True)
    assert_same_bits(narrow, wide.astype(np.float32))
    assert np.isnan(narrow).any() and (np.isinf(narrow).any() or model.overflow == "saturate")


def test_exact_outputs_float32_cannot_hold_keep_float64_carriers():
    fp, ic, _ = kernel_config(em.parse_model("exact:fp64"))
    assert not K.fp32_carriers(fp, ic, True)
