"""Stochastic rounding's random stream (version 2) and its float32-lane fp16 kernel.

The compiled stream equals the oracle's Python one; the kernel (`_native_stochastic`)
equals the general float64 kernel on every fp16 running sum and the Fraction oracle on
hypothesis cases (10,000 under -m slow); its rounding is unbiased over all 2**13 random
integers, exactly."""

import numpy as np
import pytest
from hypothesis import strategies as st

from convprobe import emulation as em
from convprobe import provenance, random_stream
from convprobe.emulation import _kernel_arithmetic as KA
from convprobe.emulation import _kernels as K
from convprobe.emulation import _native_stochastic, oracle
from convprobe.emulation.models import kernel_config
from convprobe.emulation.rounding import stochastic_bits
from convprobe.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, TF32

from .conftest import assert_same_bits, budget, fp16_arrays, needs_f16c, random_fp16, run_cases


def test_compiled_stream_equals_the_oracle_stream():
    """Seeds, indices and events over their whole ranges, every R the formats use."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        seed, index = rng.integers(0, 2**64, dtype=np.uint64), rng.integers(0, 2**64, dtype=np.uint64)
        event = int(rng.integers(0, 2**40))
        for rbits in (1, 13, 16, 20, 27, 32):
            assert KA.random_bits(seed, index, event, rbits) == oracle.random_bits(int(seed), int(index), event, rbits)


def test_the_stream_keeps_its_version_2_values():
    """Known answers of version 2 (`convprobe.random_stream`): a change here changes every
    seeded stochastic result and must come with a new STREAM_VERSION and its history."""
    known = {(0, 0, 0, 13): 7224, (1, 2, 3, 13): 5925, (12345, 678, 910, 32): 3878387814,
             (2**64 - 1, 2**63 + 5, 2**33 + 7, 27): 8157023, (7, 10**12, 4096, 16): 50114}
    assert random_stream.STREAM_VERSION == 2
    for (seed, index, event, rbits), value in known.items():
        assert oracle.random_bits(seed, index, event, rbits) == value
        assert KA.random_bits(np.uint64(seed), np.uint64(index), event, rbits) == value


def test_the_stream_is_uniform_and_its_events_uncorrelated():
    """Each of the 13 bits a stochastic fp16 rounding draws is set half the time, and
    consecutive events agree half the time: 6 sigma on 2**18 draws."""
    draws = np.array([KA.random_bits(7, index, event, 13) for index in range(512) for event in range(512)])
    bits = (draws[:, None] >> np.arange(13)) & 1
    sigma = 0.5 / np.sqrt(draws.size)
    assert np.abs(bits.mean(axis=0) - 0.5).max() < 6 * sigma
    pairs = draws.reshape(512, 512)
    agree = ((pairs[:, 1:] ^ pairs[:, :-1]) & 1) == 0
    assert abs(agree.mean() - 0.5) < 6 * 0.5 / np.sqrt(agree.size)


def test_random_bits_per_format_and_the_version_in_provenance():
    """R = 24 - p up to fp16's 11 bits (float32's significand bits below the format's),
    min(32, 51 - p) above; every result records the stream's version."""
    assert [stochastic_bits(f) for f in (FP16, BF16, FP8_E4M3, FP8_E5M2, TF32, FP32)] == [13, 16, 20, 21, 13, 27]
    assert _native_stochastic.RANDOM_BITS == 13
    # a model with several formats draws the most any takes, capped at the fewest any allows
    assert [em.parse_model(s).random_bits for s in (
        "sequential:fp16:rounding=sr", "sequential:fp32:rounding=sr:output=fp16",
        "chunked:fp16:n=4:rounding=sr", "sequential:bf16:rounding=sr:output=fp16")] == [13, 27, 27, 16]
    assert provenance.collect(seed=1)["random_stream"] == random_stream.STREAM_VERSION == 2
    assert set(random_stream.STREAM_HISTORY) == set(range(1, random_stream.STREAM_VERSION + 1))


def _gemm_native_and_general(a, w, seed):
    model = em.Sequential(FP16, rounding="stochastic", seed=seed)
    fp, ic, _ = kernel_config(model)
    assert K.native_fp16(fp, ic, True)
    got = np.empty((a.shape[0], w.shape[1]), np.float16)
    want = np.empty(got.shape)
    with np.errstate(all="ignore"):
        _native_stochastic.stochastic_gemm(a, w, got, 0, seed)
        K.gemm(a.astype(np.float64), w.astype(np.float64), fp, ic, seed, want, 0, fast=False)
    return got, want.astype(np.float16)


@needs_f16c
@pytest.mark.parametrize("seed", [0, 12345])
def test_every_fp16_running_sum(seed):
    """s over all 65,536 fp16 code points (inf and NaN included) plus a * w of every size,
    rounded stochastically: the kernel equals the general float64 kernel bit for bit; the
    sums round both ways, into and out of the subnormal range, and overflow."""
    rng = np.random.default_rng(seed)
    s = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    products = random_fp16(rng, (2, 48))
    a = np.stack([s, np.resize(products[0], s.shape)], axis=1)  # (65536, 2): s * 1, then a * w
    w = np.stack([np.ones(48, np.float16), products[1]])
    got, want = _gemm_native_and_general(a, w, seed)
    assert_same_bits(got, want)
    assert np.float32(1.0) + np.float32(2.0**-24) * np.float32(1.5) == np.float32(1.0 + 2.0**-23)  # MXCSR put back
    finite = np.isfinite(got)
    with np.errstate(all="ignore"):
        exact = a[:, :1].astype(np.float64) + a[:, 1:].astype(np.float64) * w[1].astype(np.float64)
        assert (np.abs(got[finite]) > np.abs(exact[finite])).any() and (np.abs(got[finite]) < np.abs(exact[finite])).any()
    tiny = finite & (np.abs(got) < 2.0**-14) & (got != 0)
    assert tiny.any() and np.isinf(got[np.isfinite(exact) & (np.abs(exact) < 65536)]).any()


@needs_f16c
@budget(300, 10_000)
def test_kernel_matches_the_oracle(cases_budget):
    """Random GEMMs of fp16 values over every finite bit pattern, K up to 40, any seed:
    conv2d on the float32-lane kernel equals the Fraction oracle bit for bit."""
    def body(data):
        m, k, n = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 40)), data.draw(st.integers(1, 5))
        x = data.draw(fp16_arrays((1, m, 1, k)))
        f = data.draw(fp16_arrays((1, 1, k, n)))
        model = em.Sequential(FP16, rounding="stochastic", seed=data.draw(st.integers(0, 2**64 - 1)))
        with np.errstate(all="ignore"):
            assert_same_bits(em.conv2d(x, f, model), oracle.conv2d(x, f, model))

    run_cases(cases_budget, body)


@pytest.mark.parametrize("spec", ["sequential:fp16:rounding=sr:subnormals=flush", "sequential:fp16:rounding=sr:overflow=saturate",
                                  "sequential:fp16:rounding=sr:product=fp16", "sequential:fp16:rounding=sr:addition=fp32",
                                  "sequential:fp16:rounding=sr:output=fp32", "sequential:fp16:rounding=sr:rbits=32",
                                  "chunked:fp16:n=3:rounding=sr"])
def test_other_stochastic_models_keep_off_the_kernel_and_match_the_oracle(spec):
    """Each differs from the kernel's model in one thing, so the float64 kernels run it."""
    model = em.parse_model(spec + ":seed=9")
    assert not K.native_fp16(*kernel_config(model)[:2], True)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 5, 1, 30)).astype(np.float16) * np.float16(300)
    f = rng.standard_normal((1, 1, 30, 3)).astype(np.float16)
    x[0, 0, 0, :] = np.float16(2.0**-20)  # subnormal sums
    with np.errstate(all="ignore"):
        assert_same_bits(em.conv2d(x, f, model), oracle.conv2d(x, f, model))


def test_tiny_increments_stall_at_thirteen_bits_and_move_with_rbits():
    """2048 plus 4,096 terms of 1e-4 (2**-14.3 of the ulp 2) stays 2048 for every seed with
    fp16's 13 random bits; with rbits=32 some seeds round up (about 0.2 an output expected,
    40 outputs here), as the exact sum 2048.41 asks."""
    x = np.full((1, 40, 1, 4097), 1e-4, np.float16)
    x[..., 0] = 2048.0
    f = np.ones((1, 1, 4097, 1), np.float16)
    default = em.conv2d(x, f, em.parse_model("sequential:fp16:rounding=sr:seed=1"))
    assert (default == 2048.0).all()
    finer = em.conv2d(x, f, em.parse_model("sequential:fp16:rounding=sr:rbits=32:seed=1"))
    assert set(np.unique(finer)) <= {2048.0, 2050.0, 2052.0} and (finer > 2048.0).any()


@KA.njit(cache=False)
def _rounding_sums(ys):
    """For each y, the sum over every 13-bit r of the kernel's rounding of y (float64)."""
    out = np.zeros(ys.shape[0])
    for i in range(ys.shape[0]):
        for r in range(1 << 13):
            out[i] += np.float64(_native_stochastic._round(ys[i], np.int32(r)))
    return out


def test_rounding_is_exactly_unbiased_over_every_random_integer():
    """A float32 y (the truncated sum the kernel rounds) has at most 13 bits below fp16's
    ulp, so its stochastic rounding averages to y exactly over all 2**13 integers r: normal
    and subnormal fp16 ranges, both signs, values on the fp16 grid, and the ulp step
    that crosses into the next binade. (Above 65504 the up step overflows.)"""
    rng = np.random.default_rng(4)
    ys = np.concatenate([
        rng.uniform(-60000, 60000, 200), rng.uniform(-2.0**-14, 2.0**-14, 200),
        [1.0, -1.0, 2.0**-14, -(2.0**-24), 0.5 - 2.0**-25, 2.0 - 2.0**-23, 2.0**-14 - 2.0**-37, 65500.0],
    ]).astype(np.float32)
    ys = np.where(np.abs(ys) < 2.0**-14, np.round(ys * np.float32(2.0**37)) / np.float32(2.0**37), ys)
    ys = ys.astype(np.float32)
    np.testing.assert_array_equal(_rounding_sums(ys), ys.astype(np.float64) * (1 << 13))
