"""The 65519 test: does an fp16 convolution accumulate in fp16?

From the classic question: input [65519]*4 (NHWC 1x1x4x1), filter [65519, -65519]
(HWIO 1x2x1x1), stride 1, VALID. 65519 rounds to 65504 (fp16 max) when stored in
fp16, and each output is 65504*65504 - 65504*65504. Three arithmetics give three
answers:

- 0: the products (4.29e9, far above fp16 max) were summed in a wide accumulator;
- inf: the first product was added into an fp16 accumulator, which overflowed
  (a fused multiply-add chain: exact product, one rounding to fp16 per step);
- NaN: each product was rounded to fp16 first (+inf and -inf), then summed.
"""

from __future__ import annotations

import math

import numpy as np

from convprobe.probes.encoding import decode_values, encode_bits, encode_values

__all__ = ["INPUT_VALUE", "inputs", "run", "classify", "interpret"]

INPUT_VALUE = 65519.0

WIDE = "wide accumulation (fp32 or wider)"
FP16_FUSED = "fp16 accumulator, exact products (fused multiply-add chain)"
FP16_SEPARATE = "fp16 products and fp16 sums (each rounded separately)"
UNEXPECTED = "unexpected"


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """x: [65519]*4 as fp16, NHWC 1x1x4x1; w: [65519, -65519] as fp16, HWIO 1x2x1x1."""
    x = np.full((1, 1, 4, 1), INPUT_VALUE, dtype=np.float16)
    w = np.array([INPUT_VALUE, -INPUT_VALUE], dtype=np.float16).reshape(1, 2, 1, 1)
    return x, w


def run(backend, **_params) -> dict:
    """Run the test on `backend` and return the raw outputs (values and bits)."""
    x, w = inputs()
    with np.errstate(over="ignore", invalid="ignore"):
        y = backend.conv2d(x, w, strides=1, padding="VALID")
    return {
        "output": encode_values(y),
        "output_bits": encode_bits(y),
        "output_dtype": str(np.asarray(y).dtype),
        "input_as_fp16": float(x.ravel()[0]),
    }


def classify(values) -> tuple[str, str, str]:
    """Outputs -> (accumulation, arithmetic, evidence). Accumulation: fp32, fp16 or unknown."""
    vals = [float(v) for v in values]
    p = 65504.0 * 65504.0
    if vals and all(v == 0.0 for v in vals):
        return "fp32", WIDE, (
            f"65504*65504 - 65504*65504 = 0 exactly: the products ({p:.4g}) were held wider than fp16 "
            "(a blocked fp16 tensor-core accumulator that fuses both products in one block also gives 0)"
        )
    if vals and all(math.isinf(v) for v in vals):
        return "fp16", FP16_FUSED, f"the first partial sum {p:.4g} overflowed an fp16 accumulator (max 65504) to inf"
    if vals and all(math.isnan(v) for v in vals):
        return "fp16", FP16_SEPARATE, "each product overflowed to +/-inf when rounded to fp16; inf + (-inf) = NaN"
    return "unknown", UNEXPECTED, f"outputs {vals} fit none of 0 / inf / NaN"


def interpret(observed: dict) -> dict:
    accumulation, arithmetic, evidence = classify(decode_values(observed["output"]))
    shown = ", ".join(observed["output"])
    return {
        "accumulation": accumulation,
        "arithmetic": arithmetic,
        "evidence": evidence,
        "verdict": f"[{shown}] -> {arithmetic}",
    }
