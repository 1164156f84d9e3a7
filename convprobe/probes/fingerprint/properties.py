"""Each fingerprint property as a small function: observations in, a typed `Finding` out.

A property reads the battery's outputs (`Observations`) and the typed values of the
properties it depends on, never their display text; `Finding.shown` is only for the
table. The tests behind each property are described in the package docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

import numpy as np

from convprobe.probes.fingerprint.battery import (ALIGNED_X, C_BITS, COPIES, D_BITS, DISTANCES, F16MAX,
                                                  LANE_DISTANCES, LANE_ENDS, MAX_J, ROUNDING_P, STRIDE)

T = TypeVar("T")


def lost_at_multiples(positions, lost) -> int | None:
    """W > 1 when `lost` is true exactly at the positions that are multiples of W (W being
    the first lost position): a term that shares B's narrow lane only there."""
    positions, lost = np.asarray(positions), np.asarray(lost, dtype=bool)
    if not lost.any() or lost.all():
        return None
    width = int(positions[np.argmax(lost)])
    return width if width > 1 and np.array_equal(lost, positions % width == 0) else None


@dataclass(frozen=True)
class Finding(Generic[T]):
    """A property's typed value, how the table shows it, and the evidence for it."""

    value: T
    shown: str
    evidence: str


class Observations:
    """The battery's outputs keyed by each row's metadata."""

    def __init__(self, values: dict[tuple, float]):
        self._values = values

    def __call__(self, **meta) -> float:
        return self._values[tuple(sorted(meta.items()))]

    def has(self, **meta) -> bool:
        return tuple(sorted(meta.items())) in self._values


def bits_text(bits: int) -> str:
    return f">={MAX_J + 1}" if bits > MAX_J else str(bits)


def format_name(bits: int) -> str:
    return {8: "bf16", 11: "fp16", 24: "fp32"}.get(bits, "exact/wide" if bits > MAX_J else f"{bits}-bit")


# -- accumulator: lanes, bits, alignment bits ----------------------------------------------


def lanes(get: Observations) -> Finding[int | None]:
    """W when the tiny term is lost to big exactly at the distances that are multiples of W
    (only there does it share big's narrow lane), for the first accumulator width tested."""
    if not get.has(test="lane", j=C_BITS[0], d=1, end=LANE_ENDS[0]):
        return Finding(None, "not run", "no lane rows in this battery")
    for j in C_BITS:
        lost = [all(get(test="lane", j=j, d=d, end=end) == 0.0 for end in LANE_ENDS) for d in LANE_DISTANCES]
        width = lost_at_multiples(LANE_DISTANCES, lost)
        if width is not None:
            return Finding(width, str(width),
                           f"big + 2**(14-{j}) at distance d - big lost the tiny term exactly at the multiples "
                           f"of {width}: {width} interleaved lanes, each narrower than the sum of the lanes")
    return Finding(None, "none", "the tiny term was lost at every distance or at none: one accumulator")


@dataclass(frozen=True)
class AccumulatorBits:
    """Significand bits a partial sum keeps, per ordering; `p` is the accumulator's own
    (in one lane when there are lanes), `lanes_summed` the precision lanes are summed in."""

    p: int
    by_ordering: dict[str, int]
    lanes_summed: int | None = None


def _bits_for(values: dict[int, float], big_exp: int) -> int:
    """1 + the largest j such that every tiny 2**(big_exp - j') with j' <= j survived."""
    j = 0
    while j + 1 in values and values[j + 1] == 2.0 ** (big_exp - (j + 1)):
        j += 1
    return j + 1


def accumulator_bits(get: Observations, lane_count: int | None) -> Finding[AccumulatorBits]:
    orderings = ("spread", "adjacent", "reversed", "cancel_first", "strided")
    per_order = {o: _bits_for({j: get(test="bits", ordering=o, j=j) for j in range(1, MAX_J + 1)}, 14)
                 for o in orderings}
    summed = min(per_order[o] for o in ("spread", "adjacent", "reversed"))
    if lane_count is not None and STRIDE % lane_count == 0 and per_order["strided"] < summed:
        p = per_order["strided"]
        text = ", ".join(f"{o} {bits_text(b)}" for o, b in per_order.items())
        return Finding(AccumulatorBits(p, per_order, summed), bits_text(p),
                       f"in one lane (terms {STRIDE} apart) 1.5*2**14 + 2**(14-j) keeps 2**(14-j) up to "
                       f"j = {min(p, MAX_J + 1) - 1}; the lanes are summed with {bits_text(summed)} bits; "
                       f"bits by ordering: {text}")
    del per_order["strided"]
    text = ", ".join(f"{o} {bits_text(b)}" for o, b in per_order.items())
    return Finding(AccumulatorBits(summed, per_order), bits_text(summed),
                   f"1.5*2**14 + 2**(14-j) - 1.5*2**14 keeps 2**(14-j) up to j = {min(summed, MAX_J + 1) - 1}; "
                   f"bits by ordering: {text}")


def extra_bits(bits: AccumulatorBits) -> Finding[int]:
    order = bits.by_ordering
    extra = order["adjacent"] - order["spread"] if order["adjacent"] <= MAX_J else 0
    if extra > 0:
        return Finding(extra, str(extra), "adjacent (one fused step) keeps more bits than spread: a multi-term "
                                          "adder with extra alignment bits")
    return Finding(0, "0", "adjacent and spread keep the same bits (or adjacent never rounded: terms met in "
                           "another order)")


# -- rounding -----------------------------------------------------------------------------


class SeenRounding(StrEnum):
    """The rounding the crafted ties and near-ties showed."""

    NEAREST_EVEN = "nearest_even"
    NEAREST_AWAY = "nearest_away"
    NEAREST_OTHER = "nearest_other"
    STOCHASTIC = "stochastic"
    TOWARD_ZERO = "toward_zero"
    TOWARD_POS_INF = "toward_+inf"
    TOWARD_NEG_INF = "toward_-inf"
    UNKNOWN = "unknown"
    NOT_SEEN = "n/a"


def rounding(get: Observations, bits: AccumulatorBits) -> Finding[SeenRounding]:
    p = bits.p
    if p not in ROUNDING_P:
        return Finding(SeenRounding.NOT_SEEN, "n/a", f"no partial-sum rounding observed within {MAX_J} bits")
    where = {} if bits.lanes_summed is None else {"placement": "strided"}
    ulp = 2.0 ** (16 - p)

    def row(case: str, copy: int = 0) -> float:
        return get(test="rounding", p=p, case=case, copy=copy, **where)

    above = [row("above", c) for c in range(COPIES)]
    below = [row("below", c) for c in range(COPIES)]
    tie_even, tie_odd, neg = row("tie_even"), row("tie_odd"), row("neg_above")
    ev = (f"at p={p}{' in one lane' if where else ''} (ulp {ulp:g} at 1.5*2**15): +0.75ulp -> {above[0]:g}, "
          f"+0.25ulp -> {below[0]:g}, tie on even -> {tie_even:g}, tie on odd -> {tie_odd:g}, -0.75ulp -> {neg:g}")
    if len(set(above)) > 1 or len(set(below)) > 1:
        ups = sum(v == ulp for v in above)
        mode, ev = SeenRounding.STOCHASTIC, ev + f"; the 0.75ulp row rounded up in {ups} of {COPIES} identical copies"
    elif above[0] == ulp and neg == -ulp and below[0] == 0:
        mode = (SeenRounding.NEAREST_EVEN if (tie_even == 0 and tie_odd == ulp) else
                SeenRounding.NEAREST_AWAY if (tie_even == ulp and tie_odd == ulp) else SeenRounding.NEAREST_OTHER)
    else:
        mode = {(0.0, 0.0): SeenRounding.TOWARD_ZERO, (ulp, 0.0): SeenRounding.TOWARD_POS_INF,
                (0.0, -ulp): SeenRounding.TOWARD_NEG_INF}.get((above[0], neg), SeenRounding.UNKNOWN)
    return Finding(mode, mode.value, ev)


# -- products -----------------------------------------------------------------------------


def product_bits(get: Observations) -> Finding[int | None]:
    """Significand bits a product keeps (None: exact, up to the 21 an fp16 product needs)."""
    kept = {n: max(get(test="product", n=n, ordering=o) == 2.0 ** (11 - n) for o in ("cancel_first", "product_first"))
            for n in range(3, 22)}
    n = 2
    while n + 1 in kept and kept[n + 1]:
        n += 1
    if n == 21:
        return Finding(None, "exact", "products needing up to 21 significand bits were all kept (exact for fp16 inputs)")
    return Finding(n, str(n), f"a product of two fp16 numbers needing {n + 1} significand bits lost its last bit")


def double_rounding(get: Observations, bits: AccumulatorBits, products: int | None,
                    mode: SeenRounding) -> Finding[bool | None]:
    """Only meaningful for an 11-bit accumulator with exact products (None: not decided)."""
    dr = get(test="double_rounding")
    if products is not None:
        return Finding(None, "n/a", "products are rounded: the crafted product is not the value added")
    if mode == SeenRounding.STOCHASTIC:
        return Finding(None, "n/a", "stochastic rounding: one crafted sum cannot tell")
    if bits.lanes_summed is not None:
        return Finding(None, "n/a", "the crafted terms sit in different lanes")
    if bits.p != 11:
        return Finding(None, "n/a", "the test is built for an 11-bit accumulator")
    value = {2.0**-10: True, 0.0: False}.get(dr)
    shown = {True: "yes", False: "no", None: f"unexpected {dr!r}"}[value]
    return Finding(value, shown, f"(1+2**-10) + 2**-11(1-2**-20) - (1+2**-10) -> {dr!r}: 0 = one rounding to fp16, "
                                 "2**-10 = rounded through a wider format onto the tie first")


@dataclass(frozen=True)
class Accumulation:
    """The one-line answer: the accumulator's format, products, and lanes if any."""

    bits: int
    products: int | None
    lanes: int | None = None
    lanes_summed: int | None = None

    @property
    def format(self) -> str:
        return format_name(self.bits)

    def shown(self) -> str:
        if self.lanes is not None and self.lanes_summed is not None:
            return f"{self.format} in {self.lanes} lanes, summed in {format_name(self.lanes_summed)}"
        return self.format + ("" if self.products is None else f", products to {self.products} bits")


def accumulation(bits: AccumulatorBits, products: int | None, lane_count: int | None,
                 lane_evidence: str = "") -> Finding[Accumulation]:
    """With narrow lanes the products note is left out: the product rows put their two terms
    in different lanes, where a product that starts a lane is rounded with it."""
    value = Accumulation(bits.p, products, lane_count if bits.lanes_summed is not None else None, bits.lanes_summed)
    evidence = f"{bits_text(bits.p)} significand bits in partial sums"
    if value.lanes is not None and value.lanes_summed is not None:  # lanes is set only with lanes_summed
        evidence += (f" of each of {value.lanes} lanes, {bits_text(value.lanes_summed)} where the lanes are summed "
                     f"(a product that starts a lane is rounded with it); {lane_evidence}")
    return Finding(value, value.shown(), evidence)


# -- special values -----------------------------------------------------------------------


def _kept_or_flushed(got: float, kept: float, evidence: str) -> Finding[bool | None]:
    value = {kept: True, 0.0: False}.get(got)
    return Finding(value, {True: "kept", False: "flushed", None: f"unexpected {got!r}"}[value], evidence)


def subnormal_inputs(get: Observations) -> Finding[bool | None]:
    got = get(test="subnormal_input")
    return _kept_or_flushed(got, 2.0**-14, f"2**-24 * 2**10 -> {got!r}")


def subnormal_results(get: Observations) -> Finding[bool | None]:
    got = get(test="subnormal_result")
    return _kept_or_flushed(got, 2.0**-17, f"2**-7 * 2**-10 -> {got!r}")


def overflow(get: Observations) -> Finding[str | None]:
    got = get(test="overflow")
    value = "inf" if got == math.inf else "saturate" if got == F16MAX else None
    return Finding(value, value or f"unexpected {got!r}", f"65504 + 32 -> {got!r}")


def accumulator_range(get: Observations) -> Finding[bool | None]:
    """True: wider than fp16; False: fp16's range; None: neither."""
    got = get(test="accumulator_range")
    value = True if got == 2.0**15 else False if (math.isinf(got) or got == F16MAX - 2.0**15) else None
    return Finding(value, {True: "wider than fp16", False: "fp16", None: f"unexpected {got!r}"}[value],
                   f"2**15 + 2**15 - 2**15 -> {got!r} (2**16 overflows fp16; saturation gives 65504 - 2**15)")


class ProductOverflow(StrEnum):
    """What 65504*65504 - 65504*65504 gave (the 65519 test's big brother)."""

    ZERO = "zero"
    INF = "inf"
    NAN = "nan"
    SATURATED = "saturated"
    OTHER = "other"


_PRODUCT_OVERFLOW_SHOWN = {ProductOverflow.ZERO: "0 (wide or fused)", ProductOverflow.INF: "inf (fp16 fused chain)",
                           ProductOverflow.NAN: "NaN (fp16 products)", ProductOverflow.SATURATED: "saturated (fp16 chain)"}


def product_overflow(get: Observations) -> Finding[ProductOverflow]:
    got = get(test="product_overflow")
    value = (ProductOverflow.ZERO if got == 0.0 else ProductOverflow.INF if math.isinf(got) else
             ProductOverflow.NAN if math.isnan(got) else ProductOverflow.SATURATED if abs(got) == F16MAX else
             ProductOverflow.OTHER)
    return Finding(value, _PRODUCT_OVERFLOW_SHOWN.get(value, repr(got)), f"65504*65504 - 65504*65504 -> {got!r}")


# -- block and chunk sizes ------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """A block or chunk size as the distance sweep pins it: exactly `first`, or in
    (`previous`, `first`]; or a kind without a size (lanes, tree, irregular, n/a, not run)."""

    kind: str  # "size", "lanes", "tree", "irregular", "n/a", "not run"
    first: int | None = None
    previous: int | None = None

    def shown(self) -> str:
        if self.kind == "size":
            assert self.first is not None  # a "size" is made only by swept(first), with first an int
            return str(self.first) if self.previous == self.first - 1 else f"({self.previous},{self.first}]"
        if self.kind == "lanes":
            return f"lanes={self.first}"
        return self.kind


def swept(first: int) -> Size:
    """The size the sweep reports when it first separates at distance `first`."""
    return Size("size", first, max([d for d in DISTANCES if d < first], default=0))


def _sized(size: Size, evidence: str) -> Finding[Size]:
    return Finding(size, size.shown(), evidence)


def _lane_multiples(same: set[int]) -> int | None:
    """W >= 2 if the distances in `same` are exactly the swept multiples of W (d=1 ignored)."""
    candidates = sorted(d for d in same if d >= 2)
    if not candidates:
        return None
    width = candidates[0]
    multiples = {d for d in DISTANCES if d >= 2 and d % width == 0}
    return width if set(candidates) == multiples and len(multiples) >= 3 else None


def block_size(get: Observations, bits: AccumulatorBits, pov: ProductOverflow,
               lane_count: int | None) -> Finding[Size]:
    if not get.has(test="block_overflow", d=1):
        return _sized(Size("not run"), "rows of 8192 and 16384 terms were not run for this op")
    sweep = {d: get(test="block_overflow", d=d) for d in DISTANCES}
    separated = [d for d in DISTANCES if sweep[d] != 0.0]
    text = ", ".join(f"d={d}: {sweep[d]!r}" for d in DISTANCES[:8]) + ", ..."
    zero = {d for d in DISTANCES if sweep[d] == 0.0}
    if lane_count is not None and bits.lanes_summed is not None:
        return _sized(Size("lanes", lane_count), f"the lane rows: {lane_count} interleaved narrow lanes, summed wider")
    if separated and pov == ProductOverflow.NAN:
        return _sized(Size("n/a"), "products overflow on their own (see product_overflow): the +P/-P sweep says nothing")
    if separated and _lane_multiples(zero):
        width = _lane_multiples(zero)
        return _sized(Size("lanes", width), f"+P and -P cancel exactly when d is a multiple of {width}: terms k mod "
                                            f"{width} share an accumulator (interleaved SIMD partial sums); {text}")
    if separated:
        first = separated[0]
        size = Size("tree") if math.isnan(sweep[first]) else swept(first)
        return _sized(size, f"+P and -P at distance d: {text}; first separated at d={first}")
    p = bits.p
    j = p + 1
    if p > MAX_J or j not in C_BITS:
        return _alignment_block(get, "+P/-P never overflowed (no fp16-range accumulation stage)")
    tiny = 2.0 ** (15 - j)
    swept_d = [d for d in DISTANCES if d >= 2]
    kept = {d for d in swept_d if get(test="block_bits", j=j, d=d) == tiny}
    lost = [d for d in swept_d if d not in kept]
    evidence = f"2**15 + 2**(15-{j}) - 2**15 at distance d keeps the tiny term at d in {sorted(kept)[:6]}"
    if kept and lost and _lane_multiples(kept | {1}):
        width = _lane_multiples(kept | {1})
        return _sized(Size("lanes", width), f"{evidence}...: terms k mod {width} share an accumulator "
                                            "(interleaved SIMD partial sums)")
    if kept and lost and all(d in kept for d in swept_d if d < lost[0]) and not any(d in kept for d in swept_d if d >= lost[0]):
        return _sized(swept(lost[0]), f"2**15 + 2**(15-{j}) - 2**15 at distance d keeps the tiny term until d={lost[0]}")
    if kept and lost:
        return _sized(Size("irregular"), f"{evidence}...: neither a block nor lanes")
    return _alignment_block(get, f"+P/-P never overflowed and a bit beyond the accumulator was "
                                 f"{'always' if not lost else 'never'} kept")


def _alignment_block(get: Observations, before: str) -> Finding[Size]:
    """block_size from the alignment sweep (see the package docstring), or n/a."""
    swept_d = DISTANCES[1:]
    kept = [d for d in swept_d if get(test="block_alignment", d=d) == ALIGNED_X]
    shown = ", ".join(f"d={d}: {'kept' if d in kept else 'lost'}" for d in swept_d[:8])
    if kept and kept[0] > swept_d[0] and all(d in kept for d in swept_d if d >= kept[0]):
        first = kept[0]
        return _sized(swept(first), f"{before}; 2**10 - 2**10 + x: x's last bit is truncated while x shares a block "
                                    f"with 2**10 and kept from d={first} on ({shown}, ...): blocks of {first} fused products")
    return _sized(Size("n/a"), f"{before}; 2**10 - 2**10 + x kept x at every d >= 2" if len(kept) == len(swept_d)
                  else f"{before}; alignment sweep irregular ({shown}, ...)")


def chunk_size(get: Observations, bits: AccumulatorBits) -> Finding[Size]:
    if not get.has(test="chunk", j=D_BITS[0], d=1):
        return _sized(Size("not run"), "rows of 16384 terms were not run for this op")
    j = bits.p + 1
    if j not in D_BITS:
        return _sized(Size("n/a"), "accumulator too wide for the chunk test")
    tiny = 2.0 ** (15 - j)
    kept_at = [d for d in DISTANCES if get(test="chunk", j=j, d=d) == tiny]
    if kept_at and kept_at[0] > 1 and all(d in kept_at for d in DISTANCES if kept_at[0] <= d <= 4096):
        return _sized(swept(kept_at[0]), f"2**15 first, -2**15 last, 2**(15-{j}) at distance d survives from "
                                         f"d={kept_at[0]} (a new chunk with a wider total)")
    return _sized(Size("n/a"), f"2**(15-{j}) {'never' if not kept_at else 'always'} survived at any distance")
