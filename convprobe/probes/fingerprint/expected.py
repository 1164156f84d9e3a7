"""What the battery must infer from an emulator model, from the model's parameters alone."""

from __future__ import annotations

from convprobe.emulation import Blocked, Chunked, Exact, Pairwise
from convprobe.probes.fingerprint.battery import D_BITS, DISTANCES, MAX_J, SHORT
from convprobe.probes.fingerprint.properties import bits_text, format_name, swept

__all__ = ["expected_properties", "resolved_size"]


# -- what a model should give (the self-check's expectation) -----------------------


def resolved_size(size: int) -> str:
    """How the distance sweep reports a true block or chunk size: exact, or the interval
    (previous swept distance, first swept distance >= size]."""
    return swept(min(d for d in DISTANCES if d >= size)).shown()


def expected_properties(model) -> dict[str, str]:
    """The fingerprint an emulator model must produce, derived from its parameters alone."""
    acc = model.accumulator
    exact = isinstance(model, Exact)
    p = MAX_J + 1 if exact else acc.precision
    blocked = isinstance(model, Blocked)
    # alignment bits beyond the accumulator's own (an fp16-output tensor core aligns at fp32)
    aligned = model.adder.precision + model.extra_bits if blocked else p
    extra = max(aligned - p, 0) if blocked and model.b >= 3 else 0
    fp16_range = acc.emax <= 15 and not exact
    product_precision = 22 if model.product == "exact" else model.product.precision
    if blocked:  # the block adder aligns the product to the cancelling term and truncates
        product_precision = min(product_precision, aligned)
    if p <= 9:  # the cancelling term -(1 + 2**-i + 2**-i2) needs i2 + 1 bits: it must fit the accumulator
        product_precision = min(product_precision, 2 * p - 1)
    narrow_products = model.product != "exact" and model.product.emax <= 15
    coarse = p < 11  # even P = 65504**2 rounded to the accumulator leaves an error above 65504
    if blocked and (fp16_range or aligned > p or (model.b >= 3 and model.truncate)):
        block = resolved_size(model.b)
    elif (fp16_range or coarse) and not narrow_products:
        block = "tree" if isinstance(model, Pairwise) else "1"
    else:
        block = "n/a"
    if fp16_range and narrow_products:
        pov = "NaN (fp16 products)"
    elif (fp16_range or coarse) and not (blocked and model.b >= 2) and not isinstance(model, Pairwise):
        pov = "saturated (fp16 chain)" if model.overflow == "saturate" and not coarse else "inf (fp16 fused chain)"
    else:
        pov = "0 (wide or fused)"
    if fp16_range and narrow_products:
        block = "n/a"  # products overflow on their own; see product_overflow
    rounding = "n/a" if exact else model.rounding
    if blocked and aligned - p < 2 and rounding != "stochastic":
        rounding = "toward_zero"  # 0.75 and 0.25 ulp are truncated away while aligning, before any rounding
    products = "exact" if product_precision >= 21 else str(product_precision)
    if p != 11 or products != "exact" or rounding == "stochastic":
        double = "n/a"
    elif model.addition != "exact" and 22 <= model.addition.precision <= 31 and not blocked:
        double = "yes"
    else:
        double = "no"
    return {
        "accumulation": format_name(p) + ("" if products == "exact" else f", products to {products} bits"),
        "accumulator_bits": bits_text(p),
        "extra_bits": str(extra),
        "rounding": rounding,
        "double_rounding": double,
        "product_bits": products,
        "subnormal_inputs": "kept",
        "subnormal_results": "flushed" if model.subnormals == "flush" else "kept",
        "overflow": model.overflow,
        # a fused block spanning the whole 64-term row adds 2**15 + 2**15 - 2**15 exactly
        "accumulator_range": "fp16" if fp16_range and not (blocked and model.b >= SHORT) else "wider than fp16",
        "product_overflow": pov,
        "block_size": block,
        "chunk_size": resolved_size(model.chunk) if isinstance(model, Chunked) and p + 1 in D_BITS else "n/a",
    }
