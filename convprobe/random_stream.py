"""The random stream of stochastic rounding: its definition, its version and its history.

Every stochastically rounded result depends on the bits drawn, so the stream is part
of what a seeded result means. Like the results envelope (`convprobe.results`), it has a
version, recorded in every result's provenance as ``random_stream``, and a history of
what each version changed. Two implementations follow this text: the compiled one in
`convprobe.emulation._kernel_arithmetic` and the oracle's Python one
(`convprobe.emulation.oracle.random_bits`); tests check them against each other.

Version 2 (current). Output `index` (the flat C-order index of the result) of a model
with seed `seed` has a 32-bit key, and its rounding event `event` (counted per output,
`convprobe.emulation.reduction`) draws R bits:

* key = the high 32 bits of SplitMix64(seed XOR SplitMix64(index)) (Steele, Lea &
  Flood, OOPSLA 2014);
* r = lowbias32((key + event * 0x9E3779B9) mod 2**32) >> (32 - R): a Weyl sequence
  through Wellons's lowbias32 integer hash ("Prospecting for hash functions", 2018,
  https://nullprogram.com/blog/2018/07/31/);
* R, `default_bits(p)` for a format of precision p: 24 - p for formats of at most 11
  bits (fp16, bf16, fp8, tf32), the significand bits a float32 value has below the
  format's, so rounding an exact value stochastically with R bits is rounding its float32
  truncation, as hardware that forms the sum in float32 and converts it with random bits
  does (`convprobe.emulation._native_stochastic` rounds sequential fp16 sums so, in 16
  float32 lanes); min(32, 51 - p) for wider formats. A model whose stochastically
  rounded formats differ draws the most bits any of them takes by default, capped at
  the fewest any allows (`max_bits`, min(32, 51 - p)): an fp32 accumulator with an fp16
  output draws 27. A model's ``rbits`` sets R itself, within that cap.

Rounding away from zero happens iff floor(f * 2**R) + r >= 2**R, f being the discarded
fraction of an ulp (`convprobe.emulation.rounding`): unbiased for every f with at most
R bits, otherwise low by less than 2**-R ulp. So an increment below 2**-R ulp of the
running sum never rounds up: with fp16's default R = 13, adding 1e-4 to 2048 (ulp 2)
4096 times leaves 2048, where R = 32 (``rbits=32``) averages to the exact 2048.41.
Events are counted per output as `convprobe.emulation._kernels_reference.reduce_one`
and the oracle count them: term j, then each chunk's addition to its total, then the
output rounding.
"""

from __future__ import annotations

__all__ = ["STREAM_VERSION", "STREAM_HISTORY", "WEYL32", "LOWBIAS32", "default_bits", "max_bits"]

STREAM_VERSION = 2

#: What each version changed.
STREAM_HISTORY = {
    1: "SplitMix64(SplitMix64(seed XOR SplitMix64(index)) + event) >> (64 - R), "
       "R = min(32, 51 - p) for every format (convprobe up to commit ae2ef29).",
    2: "A 32-bit key (the high half of version 1's) and lowbias32 of a Weyl sequence per "
       "event, so that the draw runs in 32-bit lanes; R = 24 - p for formats of at most 11 "
       "bits (fp16: 13, bf16: 16), min(32, 51 - p) for wider ones; a model with several "
       "formats draws the most of theirs, capped at the fewest any allows, unless its "
       "rbits sets R. Every seeded stochastic result changed, "
       "and increments below 2**-R ulp of a running sum now never round up (fp16: 2**-13 "
       "ulp, where version 1 drew 32 bits; rbits=32 restores that resolution).",
}

#: The Weyl increment per event (2**32 over the golden ratio, odd).
WEYL32 = 0x9E3779B9
#: lowbias32's two multipliers.
LOWBIAS32 = (0x7FEB352D, 0x846CA68B)

_FLOAT32_PRECISION = 24
_NARROW = 11  # formats up to fp16's precision draw the float32 significand's bits below theirs


def max_bits(precision: int) -> int:
    """The most random bits a rounding to this precision may draw: one 32-bit word, and
    51 - p, which keeps the bits it inspects exact in a round-to-odd float64 sum."""
    return min(32, 51 - precision)


def default_bits(precision: int) -> int:
    """R, the default random bits per stochastic rounding to a format of this precision."""
    if precision <= _NARROW:
        return _FLOAT32_PRECISION - precision
    return max_bits(precision)
