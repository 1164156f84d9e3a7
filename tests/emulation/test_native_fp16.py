"""The hardware fp16 kernels (the AVX512-FP16 FMA; float32 arithmetic with F16C's
conversions for addition=fp32, and for nearest even and toward zero without the fp16 FMA)
equal the float64 kernels and the oracle bit for bit.

Where the CPU lacks an instruction its kernel is never used; those comparisons then
skip, and the detection test still checks that it is correctly switched off."""

import numpy as np
import pytest

from convprobe import emulation as em
from convprobe.emulation import _kernels as K
from convprobe.emulation import _native_fp16
from convprobe.emulation.models import kernel_config
from convprobe.formats import FP8_E4M3, FP16, FP32

from .conftest import assert_same_bits, needs_f16c, needs_fp16_fma, random_fp16


MODELS = [em.Sequential(FP16), em.Sequential(FP16, addition=FP32),
          em.parse_model("chunked:fp16:n=16"), em.parse_model("chunked:fp16:n=5:addition=fp32"),
          em.Sequential(FP16, rounding="toward_zero"), em.Sequential(FP16, rounding="toward_zero", subnormals="flush"),
          # the float32-lane stochastic kernel; the float64 kernels on fp16 bit patterns
          em.Sequential(FP16, rounding="stochastic", seed=3), em.Sequential(FP16, product=FP16, subnormals="flush"),
          em.parse_model("chunked:fp16:n=3:total=fp16:rounding=toward_zero")]


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(not _cpuinfo_flags(), reason="no /proc/cpuinfo flags to compare with")
def test_detection_matches_the_kernel_flags(monkeypatch):
    monkeypatch.delenv("CONVPROBE_NATIVE_FP16", raising=False)
    assert _native_fp16.available() == ("avx512_fp16" in _cpuinfo_flags())
    assert _native_fp16.available(fma=False) == ("f16c" in _cpuinfo_flags())
    monkeypatch.setenv("CONVPROBE_NATIVE_FP16", "0")
    assert not _native_fp16.available() and not _native_fp16.available(fma=False)


def _float64_path(monkeypatch):
    monkeypatch.setenv("CONVPROBE_NATIVE_FP16", "0")


@needs_f16c
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.to_spec())
def test_float16_carrier_kernels_equal_float64_kernels(model, monkeypatch):
    """Every finite magnitude, both signs, overflow, subnormal results: 1.2M terms on
    shapes that exercise the four-row blocks and the leftover rows; chunked models with
    chunks that divide K and that do not."""
    rng = np.random.default_rng(3)
    x = random_fp16(rng, (3, 7, 11, 24))
    x[0] = np.copysign(np.float16(2.0**-23), x[0])  # sums that are subnormal or zero
    w = random_fp16(rng, (3, 3, 24, 5), lo=0x0001, hi=0x3C00)
    kwargs = dict(strides=(1, 2), padding="SAME")
    with np.errstate(all="ignore"):
        native = em.conv2d(x, w, model, **kwargs)
        dx_native = em.conv2d_backprop_input(native, w, x.shape, model, **kwargs)
        dw_native = em.conv2d_backprop_filter(x, native, w.shape, model, **kwargs)
        assert K.fp16_carriers(*kernel_config(model)[:2], True)
        _float64_path(monkeypatch)
        assert not K.fp16_carriers(*kernel_config(model)[:2], True)
        assert_same_bits(native, em.conv2d(x, w, model, **kwargs))
        assert_same_bits(dx_native, em.conv2d_backprop_input(native, w, x.shape, model, **kwargs))
        assert_same_bits(dw_native, em.conv2d_backprop_filter(x, native, w.shape, model, **kwargs))
    assert np.isinf(native).any() and (native == 0).any()  # the test reached both ends
    assert model.subnormals == "flush" or (np.abs(native[native != 0]) < 2.0**-14).any()


# 1 + p with p = 2**-11 + 5.7e-8 (a product of two fp16 values): one rounding gives
# 1 + 2**-10; rounding first to float32 lands on the midpoint 1 + 2**-11, which ties to 1.
_TWICE_X = np.array([1.0, 1.01953125], dtype=np.float16).reshape(1, 1, 2, 1)
_TWICE_W = np.array([1.0, 0.00047898292541503906], dtype=np.float16).reshape(1, 2, 1, 1)


@needs_f16c
def test_one_rounding_where_float32_would_round_twice():
    """The fp16 FMA, or float32's sum rounded to odd, must round once."""
    assert K.native_fp16(*kernel_config(em.Sequential(FP16))[:2], True)
    assert em.conv2d(_TWICE_X, _TWICE_W, em.Sequential(FP16)).item() == 1.0 + 2.0**-10


@needs_f16c
def test_the_addition_fp32_kernel_rounds_twice_as_its_model_says():
    """The addition=fp32 model rounds to float32, then to fp16: 1 on the conversions' kernel."""
    model = em.Sequential(FP16, addition=FP32)
    assert K.native_fp16(*kernel_config(model)[:2], True)
    assert em.conv2d(_TWICE_X, _TWICE_W, model).item() == 1.0 == em.oracle.conv2d(_TWICE_X, _TWICE_W, model).item()


@needs_f16c
def test_fp8_inputs_take_the_native_kernel_and_agree(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 6, 8)).astype(FP8_E4M3.dtype)
    w = rng.standard_normal((3, 3, 8, 4)).astype(FP8_E4M3.dtype)
    model = em.Sequential(FP16)
    fp, ic, _ = kernel_config(model)
    assert K.native_fp16(fp, ic, em.reduction.fp16_or_narrower(x, w))
    native = em.conv2d(x, w, model, padding="SAME")
    assert_same_bits(native, em.oracle.conv2d(x, w, model, padding="SAME"))
    _float64_path(monkeypatch)
    assert_same_bits(native, em.conv2d(x, w, model, padding="SAME"))


@needs_f16c
def test_toward_zero_overflows_to_inf_and_leaves_the_rounding_mode_as_it_was():
    """IEEE truncation stops at 65504; the model overflows to inf at 65536 and beyond, and
    keeps 65504 below it. The kernel sets MXCSR to toward zero in its threads and must put
    it back: float arithmetic here rounds to nearest again afterwards."""
    model = em.Sequential(FP16, rounding="toward_zero")
    x = np.array([[[[65504.0, 16.0]]], [[[65504.0, 31.0]]], [[[65504.0, 32.0]]]], dtype=np.float16)
    w = np.ones((1, 1, 2, 1), dtype=np.float16)
    got = em.conv2d(x, w, model).ravel()
    assert got.tolist() == [65504.0, 65504.0, np.inf]  # 65520 and 65535 truncate; 65536 overflows
    assert np.float32(1.0) + np.float32(2.0**-24) * np.float32(1.5) == np.float32(1.0 + 2.0**-23)
    # every worker thread too: the float32 FMA kernel (parallel) rounds to nearest again
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 6, 6, 16)).astype(np.float16), rng.standard_normal((3, 3, 16, 8)).astype(np.float16)
    fp32 = em.Sequential(FP32)
    assert_same_bits(em.conv2d(x, w, fp32), em.oracle.conv2d(x, w, fp32))


@needs_f16c
@pytest.mark.parametrize("fp16_fma", [False, pytest.param(True, marks=needs_fp16_fma)])
@pytest.mark.parametrize("rounding, subnormals", [("toward_zero", "keep"), ("toward_zero", "flush"),
                                                  ("nearest_even", "keep")])
def test_every_fp16_running_sum(fp16_fma, rounding, subnormals):
    """Each step rounds s + a * w once: s over all 65,536 fp16 code points (inf and NaN
    included), against products of every size, on the fp16 FMA and without it (toward
    zero: the float32 FMA and F16C's truncating conversion; nearest: float32's sum
    rounded to odd, then converted), equal to the general float64 kernel bit for bit."""
    rng = np.random.default_rng(11)
    s = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    products = random_fp16(rng, (2, 64))  # the second step's a, and w's columns
    a = np.stack([s, np.resize(products[0], s.shape)], axis=1)  # (65536, 2): s * 1, then a * w
    w = np.stack([np.ones(64, np.float16), products[1]])
    w[1, 0] = 1.0
    edge = np.isin(s, np.float16([65504.0, -65504.0]))  # sums of exactly +-65536 overflow, below it truncate
    a[edge, 1] = np.copysign(np.float16(32.0), s[edge])
    model = em.Sequential(FP16, rounding=rounding, subnormals=subnormals)
    fp, ic, _ = kernel_config(model)
    got = np.empty((a.shape[0], 64), np.float16)
    with np.errstate(all="ignore"):
        _native_fp16.sequential_gemm(a, w, got, 0, add32=False, flush=subnormals == "flush",
                                     toward_zero=rounding == "toward_zero", fp16_fma=fp16_fma)
        want = np.empty(got.shape)
        K.gemm(a.astype(np.float64), w.astype(np.float64), fp, ic, 0, want, 0, fast=False)
    assert_same_bits(got, want.astype(np.float16))
    assert np.isinf(got[edge, 0]).all() and np.isinf(got[np.isfinite(s)]).any()  # (65536 overflows either way)
    assert (got == 65504).any() and (got == 0).any()


@needs_f16c
@pytest.mark.parametrize("wide", [np.float64, np.float32])
def test_conversions_keep_every_fp16_code_point(wide):
    """`convert` (F16C, in parallel) widens every fp16 code point exactly and narrows it back
    to the same bits, NaNs aside; what it does not convert it leaves to NumPy."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    half = bits.view(np.float16)
    widened = _native_fp16.convert(half, wide)
    assert widened.dtype == wide and widened.flags.c_contiguous
    np.testing.assert_array_equal(widened, half.astype(wide))  # (NaN == NaN here)
    assert_same_bits(_native_fp16.convert(widened, np.float16), half)
    assert _native_fp16.convert(widened, np.float64).dtype == np.float64


@needs_f16c
@pytest.mark.parametrize("model", [em.Sequential(FP16), em.Sequential(FP16, rounding="toward_zero"),
                                   em.Sequential(FP16, rounding="toward_zero", subnormals="flush"),
                                   em.parse_model("chunked:fp16:n=2"),
                                   *(em.Sequential(FP16, rounding="stochastic", seed=s) for s in range(12))],
                         ids=lambda m: m.to_spec())
def test_signed_zeros_and_cancellation_on_the_hardware_kernels(model):
    """-0 + -0 stays -0, x + (-x) is +0 (both roundings), a flushed tiny sum keeps its sign,
    sums at 2**-14 and 65504 (whose ulp step overflows): the hardware kernels (stochastic
    rounding for many seeds) against the oracle on crafted rows (found missing in review)."""
    assert K.native_fp16(*kernel_config(model)[:2], True)
    rows = [[-0.0, -0.0], [1.0, -1.0], [-(2.0**-24), -0.0], [-(2.0**-24), 2.0**-24], [65504.0, -65504.0],
            [-(2.0**-14), 2.0**-24], [65504.0, 8.0], [-65504.0, -16.0], [2.0**-14, -(2.0**-24)], [6e-5, 3e-8]]
    x = np.array(rows, dtype=np.float16).reshape(len(rows), 1, 1, 2)
    for w in ([[1.0], [1.0]], [[2.0**-4], [1.0]], [[1.0], [-1.0]], [[1.0], [0.0999]]):
        w = np.array(w, dtype=np.float16).reshape(1, 1, 2, 1)
        with np.errstate(over="ignore"):
            assert_same_bits(em.conv2d(x, w, model), em.oracle.conv2d(x, w, model))


@pytest.mark.parametrize("model", [em.Sequential(FP16, subnormals="flush"),
                                   em.Sequential(FP16, addition=FP32, subnormals="flush"),
                                   em.parse_model("chunked:fp16:n=7:subnormals=flush")], ids=lambda m: m.to_spec())
def test_flushing_models_rounded_to_nearest_keep_off_the_hardware(model):
    """2047/1024 * 2**-15 = 1023.5 * 2**-24 ties up to 2**-14 on fp16's subnormal grid, but
    the model rounds with an unbounded exponent (2047 * 2**-25 is exact), then flushes it:
    0. So these models take the float64 kernels."""
    assert not K.native_fp16(*kernel_config(model)[:2], True)
    x = np.array([2047 / 1024], dtype=np.float16).reshape(1, 1, 1, 1)
    w = np.array([2.0**-15], dtype=np.float16).reshape(1, 1, 1, 1)
    assert em.conv2d(x, w, model).item() == 0.0 == em.oracle.conv2d(x, w, model).item()


@pytest.mark.parametrize("spec", ["sequential:fp8_e4m3:output=fp16", "chunked:fp8_e4m3:n=3:output=fp16"])
def test_float16_carriers_keep_the_input_checks(spec):
    """An accumulator without infinities refuses inf inputs on every carrier (found in review:
    the float16 path once skipped the check and returned NaN)."""
    from convprobe.errors import InvalidArgument

    model = em.parse_model(spec)
    assert K.fp16_carriers(*kernel_config(model)[:2], True) == _native_fp16.available(fma=False)
    x = np.array([1.0, np.inf, 1.0], dtype=np.float16).reshape(1, 1, 3, 1)
    w = np.ones((1, 2, 1, 1), np.float16)
    with pytest.raises(InvalidArgument, match="x contains inf, which the accumulator format fp8_e4m3"):
        em.conv2d(x, w, model)


@needs_f16c
@pytest.mark.parametrize("fp16_fma", [False, pytest.param(True, marks=needs_fp16_fma)])
@pytest.mark.parametrize("addition", ["exact", "fp32"])
def test_chunk_totals_kept_in_float32_are_the_chunked_model_with_an_fp32_output(fp16_fma, addition):
    """`chunked_gemm_fp32_total` (split-K's fp16 ranges summed in fp32) is the chunked
    model with an fp32 output: the general float64 kernel's results bit for bit, for
    chunks of 1, 5 and more than K, on fp16 values of every size and sign (chunks that
    overflow fp16, inf - inf), small ones (exact sums) included."""
    rng = np.random.default_rng(17)
    a, w = random_fp16(rng, (70, 23)), random_fp16(rng, (23, 9), hi=0x5000)  # (w below 32)
    a[:35] = rng.standard_normal((35, 23)).astype(np.float16)
    for chunk in (1, 5, 40):
        model = em.parse_model(f"chunked:fp16:n={chunk}:addition={addition}:output=fp32")
        fp, ic, _ = kernel_config(model)
        got = np.empty((70, 9), np.float32)
        with np.errstate(all="ignore"):
            _native_fp16.chunked_gemm_fp32_total(a, w, got, 0, add32=addition == "fp32", chunk=chunk,
                                                 fp16_fma=fp16_fma)
            want = np.empty(got.shape)
            K.gemm(a.astype(np.float64), w.astype(np.float64), fp, ic, 0, want, 0, fast=False)
        assert_same_bits(got.astype(np.float64), want)
        assert np.isfinite(got[:35]).all() and not np.isfinite(got[35:]).all()
