"""Real fp16 versus fake fp16: is an fp16 conv just fp32 compute then a cast?

The classic comparison (x 16x32x32x16, w 3x3x16x16, VALID, uniform [0, 1),
seeded): "real" feeds fp16 tensors to the conv; "fake" rounds the same inputs to
fp16, convolves in fp32 and rounds the result to fp16; both are measured
against a float64 reference. Bit-for-bit equality means fp32 (or wider)
accumulation. Otherwise the real result's error is compared with two derived
bounds (in fp16 ulps, elementwise, S = sum |x||w| in float64):

    fp32 accumulation:  0.5 + gamma_K(2**-24) * S / ulp_fp16(ref)
    fp16 accumulation:  0.5 + gamma_K(2**-11) * S / ulp_fp16(ref)

with gamma_K(u) = K u / (1 - K u) (Higham 2002, §3.1) and K = kh*kw*C_in. Within
the first bound, the difference is only summation order. Between the first bound and

    fp32 block FMA, truncating:  0.5 + gamma_{4K+2}(2**-23) * S / ulp_fp16(ref)

lies an fp32 tensor-core accumulator: each block of b products and the running sum
loses less than one quantum 2**(E-23) per addend while aligning (2**E <= the largest
addend, for normal inputs) plus one truncation of the sum, so q = ceil(K/b) blocks lose
at most q (b + 2) 2**-23 S <= (4K + 2) 2**-23 S to first order. Beyond it, the
accumulator is narrower than fp32.
"""

from __future__ import annotations

import numpy as np

from convprobe.errors import InvalidArgument
from convprobe.formats import FP16, FP32
from convprobe.probes.reference import conv2d_float64
from convprobe.provenance import memory_limit
from convprobe.render import share_text

__all__ = ["DEFAULT_SHAPES", "inputs", "run", "interpret", "memory_estimate", "check_shapes"]

DEFAULT_SHAPES = {"batch": 16, "height": 32, "width": 32, "channels": 16, "filters": 16, "kernel": 3}


def memory_estimate(batch: int, height: int, width: int, channels: int, filters: int, kernel: int) -> int:
    """Bytes the largest run holds at once, roughly: every operand in float64 (the input and the
    filter), the im2col patches (M x K float64) and a dozen float64 output-sized arrays
    (reference, magnitude, errors)."""
    m = batch * max(height - kernel + 1, 0) * max(width - kernel + 1, 0)
    operands = batch * height * width * channels + kernel * kernel * channels * filters
    return 8 * (operands + m * kernel * kernel * channels + 12 * m * filters)


def check_shapes(batch: int, height: int, width: int, channels: int, filters: int, kernel: int) -> None:
    """Refuse, before anything runs, a kernel larger than the image or shapes whose arrays
    would not fit in `provenance.memory_limit()` (half this machine's memory)."""
    if kernel > min(height, width):
        raise InvalidArgument(f"kernel must be at most height and width ({min(height, width)}); received {kernel}")
    need, limit = memory_estimate(batch, height, width, channels, filters, kernel), memory_limit()
    if need > limit:
        raise InvalidArgument(f"compare shapes need about {need / 2**30:.1f} GiB (float64 reference and "
                              f"patches); at most {limit / 2**30:.1f} GiB (half this machine's memory) is "
                              f"allowed: reduce --batch, --height, --width, --channels or --filters")


def inputs(seed: int, batch: int, height: int, width: int, channels: int, filters: int, kernel: int):
    """Seeded U[0, 1) inputs, already rounded to fp16 (the question's setup)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (batch, height, width, channels)).astype(np.float16)
    w = rng.uniform(0.0, 1.0, (kernel, kernel, channels, filters)).astype(np.float16)
    return x, w


def _errors(result: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
    from convprobe.analysis import fraction_correctly_rounded, max_relative_error, ulp_error

    ulps = ulp_error(result, reference, FP16)
    return {
        "max_ulp_error": float(np.max(ulps)),
        "mean_ulp_error": float(np.mean(ulps)),
        "max_relative_error": float(max_relative_error(result, reference)),
        "fraction_correctly_rounded": float(fraction_correctly_rounded(result, reference, FP16)),
    }, ulps


def run(backend, *, seed: int = 0, **shape) -> dict:
    """Run real and fake fp16 convs on `backend`; return error statistics (no arrays)."""
    from convprobe.analysis import fraction_different, gamma, max_abs_diff, ulp_error

    dims = {**DEFAULT_SHAPES, **shape}
    x, w = inputs(seed, **dims)
    real = np.asarray(backend.conv2d(x, w, strides=1, padding="VALID"))
    fake32 = np.asarray(backend.conv2d(x.astype(np.float32), w.astype(np.float32), strides=1, padding="VALID"))
    fake = fake32.astype(np.float16)
    reference = conv2d_float64(x, w)
    magnitude = conv2d_float64(np.abs(x), np.abs(w))
    k = dims["kernel"] * dims["kernel"] * dims["channels"]
    real_errors, real_ulps = _errors(real, reference)
    fake_errors, _ = _errors(fake, reference)
    fp32_bound = 0.5 + ulp_error(reference + gamma(k, FP32.unit_roundoff) * magnitude, reference, FP16)
    truncating_bound = 0.5 + ulp_error(reference + gamma(4 * k + 2, FP32.epsilon) * magnitude,
                                       reference, FP16)
    fp16_bound = 0.5 + ulp_error(reference + gamma(k, FP16.unit_roundoff) * magnitude, reference, FP16)
    return {
        "shapes": {"x": list(x.shape), "w": list(w.shape), "y": list(real.shape)},
        "real_dtype": str(real.dtype),
        "reduction_length": k,
        "seed": seed,
        "max_abs_diff": float(max_abs_diff(real.astype(np.float64), fake.astype(np.float64))),
        "fraction_different": float(fraction_different(real, fake)),
        "real": real_errors,
        "fake": fake_errors,
        "fp32_bound_max_ulp": float(np.max(fp32_bound)),
        "fp32_block_bound_max_ulp": float(np.max(truncating_bound)),
        "fp16_bound_max_ulp": float(np.max(fp16_bound)),
        "real_within_fp32_bound": bool(np.all(real_ulps <= fp32_bound)),
        "real_within_fp32_block_bound": bool(np.all(real_ulps <= truncating_bound)),
        "real_within_fp16_bound": bool(np.all(real_ulps <= fp16_bound)),
    }


def interpret(observed: dict) -> dict:
    real, fake = observed["real"], observed["fake"]
    numbers = (
        f"max |real - fake| = {observed['max_abs_diff']:.6g}, "
        f"{share_text(observed['fraction_different'], up=True)} of elements differ; max error vs fp64: "
        f"real {real['max_ulp_error']:.3f} ulp, fake {fake['max_ulp_error']:.3f} ulp "
        f"(fp32-accumulation bound {observed['fp32_bound_max_ulp']:.3f} ulp)"
    )
    if observed["fraction_different"] == 0.0:
        return {"accumulation": "fp32", "arithmetic": "fp32 compute then cast",
                "verdict": "identical to fp32 compute then cast", "evidence": numbers}
    if observed["real_within_fp32_bound"]:
        return {"accumulation": "fp32", "arithmetic": "fp32 accumulation, different summation order",
                "verdict": "differs from fake fp16 only within the fp32-accumulation bound (summation order)",
                "evidence": numbers}
    if observed.get("real_within_fp32_block_bound"):
        return {"accumulation": "fp32",
                "arithmetic": "fp32 block FMA with truncation (tensor-core-like)",
                "verdict": "differs beyond round-to-nearest fp32, within the truncating fp32 "
                           "block-FMA bound", "evidence": numbers}
    if observed["real_within_fp16_bound"]:
        return {"accumulation": "fp16", "arithmetic": "accumulation below fp32 (consistent with fp16)",
                "verdict": "differs: accumulation below fp32", "evidence": numbers}
    return {"accumulation": "unknown", "arithmetic": "errors beyond the fp16-accumulation bound",
            "verdict": "differs beyond any fp16-accumulation bound", "evidence": numbers}
