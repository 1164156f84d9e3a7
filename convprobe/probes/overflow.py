"""The 65519 test: does an fp16 convolution accumulate in fp16?

From the classic question: input [65519]*4 (NHWC 1x1x4x1), filter [65519, -65519]
(HWIO 1x2x1x1), stride 1, VALID. 65519 rounds to 65504 (fp16 max) when stored in
fp16, and each output is 65504*65504 - 65504*65504. Three arithmetics give three
answers:

- 0: the products (4.29e9, far above fp16 max) were summed in a wide accumulator;
- inf: the first product was added into an fp16 accumulator, which overflowed
  (a fused multiply-add chain: exact product, one rounding to fp16 per step);
- NaN: each product was rounded to fp16 first (+inf and -inf), then summed.

A block-FMA (tensor-core) fp16 accumulator fuses both products in one block and also
gives 0. So the probe also runs the *spread* test: the same two products d positions
apart along the reduction (filter [65519, 0, ..., 0, -65519], K = d + 1), d = 1..64.
An fp16 accumulator that fuses blocks of b products gives 0 for d < b and inf from
d = b on, which names both the accumulator and the block size; a wide accumulator
gives 0 at every d.
"""

from __future__ import annotations

import math

import numpy as np

from convprobe.probes.encoding import decode_values, encode_bits, encode_values

__all__ = ["INPUT_VALUE", "SPREADS", "inputs", "spread_inputs", "run", "classify", "interpret"]

INPUT_VALUE = 65519.0
SPREADS = tuple(range(1, 65))

WIDE = "wide accumulation (fp32 or wider)"
FP16_FUSED = "fp16 accumulator, exact products (fused multiply-add chain)"
FP16_SEPARATE = "fp16 products and fp16 sums (each rounded separately)"
UNEXPECTED = "unexpected"


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """x: [65519]*4 as fp16, NHWC 1x1x4x1; w: [65519, -65519] as fp16, HWIO 1x2x1x1."""
    x = np.full((1, 1, 4, 1), INPUT_VALUE, dtype=np.float16)
    w = np.array([INPUT_VALUE, -INPUT_VALUE], dtype=np.float16).reshape(1, 2, 1, 1)
    return x, w


def spread_inputs(d: int) -> tuple[np.ndarray, np.ndarray]:
    """x: [65519]*(d+1), NHWC 1x1x(d+1)x1; w: 65519 at tap 0, -65519 at tap d, zeros between."""
    x = np.full((1, 1, d + 1, 1), INPUT_VALUE, dtype=np.float16)
    w = np.zeros((1, d + 1, 1, 1), dtype=np.float16)
    w[0, 0], w[0, d] = INPUT_VALUE, -INPUT_VALUE
    return x, w


def run(backend, **_params) -> dict:
    """Run the test and the spread test on `backend`; the raw outputs (values and bits)."""
    x, w = inputs()
    with np.errstate(over="ignore", invalid="ignore"):
        y = backend.conv2d(x, w, strides=1, padding="VALID")
        spread = [encode_values(backend.conv2d(*spread_inputs(d), strides=1, padding="VALID"))[0]
                  for d in SPREADS]
    return {
        "output": encode_values(y),
        "output_bits": encode_bits(y),
        "output_dtype": str(np.asarray(y).dtype),
        "input_as_fp16": float(x.ravel()[0]),
        "spread": dict(zip((str(d) for d in SPREADS), spread)),
    }


def block_size(spread: dict[str, str]) -> int | None:
    """The smallest spread d at which the two products overflow an fp16 accumulator
    (inf): the block size of a block-FMA fp16 accumulator; None if none does."""
    for d, value in sorted(((int(k), v) for k, v in spread.items())):
        if math.isinf(decode_values([value])[0]):
            return d
    return None


def classify(values) -> tuple[str, str, str]:
    """Outputs -> (accumulation, arithmetic, evidence). Accumulation: fp32, fp16 or unknown."""
    vals = [float(v) for v in values]
    p = 65504.0 * 65504.0
    if vals and all(v == 0.0 for v in vals):
        return "fp32", WIDE, (
            f"65504*65504 - 65504*65504 = 0 exactly: the products ({p:.4g}) were held wider than fp16"
        )
    if vals and all(math.isinf(v) for v in vals):
        return "fp16", FP16_FUSED, f"the first partial sum {p:.4g} overflowed an fp16 accumulator (max 65504) to inf"
    if vals and all(math.isnan(v) for v in vals):
        return "fp16", FP16_SEPARATE, "each product overflowed to +/-inf when rounded to fp16; inf + (-inf) = NaN"
    return "unknown", UNEXPECTED, f"outputs {vals} fit none of 0 / inf / NaN"


def blocked_arithmetic(b: int) -> str:
    return f"fp16 accumulator, fused blocks of {b} exact products (block FMA)"


def interpret(observed: dict) -> dict:
    accumulation, arithmetic, evidence = classify(decode_values(observed["output"]))
    b = block_size(observed.get("spread", {}))
    if accumulation == "fp32" and b is not None:
        p = 65504.0 * 65504.0
        accumulation, arithmetic = "fp16", blocked_arithmetic(b)
        evidence = (f"0 when both products meet in one block, but {p:.4g} overflowed an fp16 "
                    f"accumulator to inf once they were {b} positions apart (spread test): "
                    f"blocks of {b} products fused, each block's sum rounded to fp16")
    elif accumulation == "fp32":
        evidence += f"; still 0 with the products up to {max(SPREADS)} positions apart"
    shown = ", ".join(observed["output"])
    return {
        "accumulation": accumulation,
        "arithmetic": arithmetic,
        "evidence": evidence,
        "verdict": f"[{shown}] -> {arithmetic}",
    }
