"""The fingerprint battery itself: the crafted rows, grouped into op calls (see the
package docstring for what each test decides)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["PROPERTIES", "ORDERINGS", "DISTANCES", "STRIDE", "Group", "battery"]

#: The inferred properties, in table order.
PROPERTIES = (
    "accumulation", "accumulator_bits", "extra_bits", "rounding", "double_rounding", "product_bits",
    "subnormal_inputs", "subnormal_results", "overflow", "accumulator_range",
    "product_overflow", "block_size", "chunk_size",
)

ORDERINGS = ("spread", "adjacent", "reversed", "cancel_first", "strided")

MAX_J = 38  # tiny = 2**(14 - j) must stay an fp16 number (>= 2**-24)
ROUNDING_P = range(2, 39)  # ulp = 2**(16 - p) and 0.25 ulp must be fp16 numbers
COPIES = 16  # 16 stochastic roundings of +0.75 ulp all go up w.p. 0.75**16 ~ 1%; with the 0.25 rows ~ 1e-4
SHORT = 64
#: Every term of a `strided` row sits at a multiple of STRIDE: in one SIMD lane whenever
#: the lane count divides it.
STRIDE = 16
#: `lane` rows: the tiny term at every distance d, -big at one of two ends (a lane may hold
#: one end, never both).
LANE_ENDS = (SHORT - 1, SHORT - 2)
LANE_DISTANCES = tuple(range(1, SHORT - 2))
SPECIAL = 128
LONG = 16384
MAX_LEN = 8192
#: Distances swept for block and chunk sizes: every d to 16, then 2**k - 1 and 2**k, so a
#: power-of-two size is pinned exactly and any other one to an interval.
DISTANCES = tuple(range(1, 17)) + tuple(d for k in range(5, 13) for d in (2**k - 1, 2**k))
C_BITS = (9, 12, 25)  # tiny one bit beyond bf16, fp16, fp32 accumulators
ALIGNED_X = 2.0**-8 + 2.0**-18  # its last bit lies below the quantum of a block aligned to 2**10
D_BITS = (9, 12)
F16MAX = 65504.0


@dataclass
class Group:
    """One op call: out[m] = sum_k a[m, k] b[channel[m], k] (b holds one filter per channel)."""

    name: str
    b: np.ndarray
    a: np.ndarray
    rows: list[dict]
    channel: np.ndarray | None = None


def _merge(name: str, groups: list[Group]) -> Group:
    """Several single-filter groups as one call: rows stacked, each reading its own filter."""
    length = max(g.a.shape[1] for g in groups)
    a = np.zeros((sum(len(g.rows) for g in groups), length), dtype=np.float16)
    b = np.zeros((len(groups), length), dtype=np.float16)
    channel, rows, at = [], [], 0
    for c, g in enumerate(groups):
        n, width = g.a.shape
        a[at:at + n, :width] = g.a
        b[c, :width] = g.b
        channel += [c] * n
        rows += g.rows
        at += n
    return Group(name, b, a, rows, np.array(channel, dtype=np.int64))


class _Builder:
    def __init__(self, name: str, length: int, b: np.ndarray | None = None):
        self.name, self.length = name, length
        self.b = np.ones(length) if b is None else b
        self.rows: list[dict] = []
        self.terms: list[dict[int, float]] = []

    def add(self, meta: dict, terms: dict[int, float]) -> None:
        for pos, value in terms.items():
            if float(np.float16(value)) != value:
                raise AssertionError(f"{meta}: {value!r} at {pos} is not an fp16 number")
        self.rows.append(meta)
        self.terms.append(terms)

    def build(self) -> Group:
        a = np.zeros((len(self.rows), self.length), dtype=np.float16)
        for i, terms in enumerate(self.terms):
            for pos, value in terms.items():
                a[i, pos] = value
        return Group(self.name, self.b.astype(np.float16), a, self.rows)


def _ordering_terms(ordering: str, big: float, tiny: float, length: int) -> dict[int, float]:
    last = length - 1
    return {
        "spread": {0: big, 1: tiny, last: -big},
        "adjacent": {0: big, 1: tiny, 2: -big},
        "reversed": {0: -big, last - 1: tiny, last: big},
        "cancel_first": {0: big, 1: -big, 2: tiny},
        "strided": {0: big, STRIDE: tiny, last: -big},
    }[ordering]


def _rounding_cases(rbig: float, ulp: float, last: int, at: int) -> dict[str, dict[int, float]]:
    """The rounding rows with the small terms at multiples of `at` (1: next to big)."""
    return {
        "above": {0: rbig, at: 0.75 * ulp, last: -rbig},
        "below": {0: rbig, at: 0.25 * ulp, last: -rbig},
        "tie_even": {0: rbig, at: 0.5 * ulp, last: -rbig},
        "tie_odd": {0: rbig, at: ulp, 2 * at: 0.5 * ulp, 3 * at if at > 1 else last - 1: -ulp, last: -rbig},
        "neg_above": {0: -rbig, at: -0.75 * ulp, last: rbig},
    }


@functools.lru_cache(maxsize=1)
def battery() -> tuple[Group, ...]:
    """The crafted inputs, grouped by filter vector (deterministic: no randomness)."""
    short = _Builder("short", SHORT)
    big = 2.0**15
    mid = 1.5 * 2.0**14  # mid-binade: +tiny and -tiny see the same ulp, whichever way the sum runs
    for ordering in ORDERINGS:
        for j in range(1, MAX_J + 1):
            short.add({"test": "bits", "ordering": ordering, "j": j},
                      _ordering_terms(ordering, mid, 2.0 ** (14 - j), SHORT))
    rbig = 1.5 * 2.0**15
    last = SHORT - 1
    for p in ROUNDING_P:
        ulp = 2.0 ** (16 - p)
        for placement, at in (("next", 1), ("strided", STRIDE)):
            cases = _rounding_cases(rbig, ulp, last, at)
            meta = {"test": "rounding", "p": p} | ({} if at == 1 else {"placement": placement})
            for case, terms in cases.items():
                short.add({**meta, "case": case, "copy": 0}, terms)
            for copy in range(1, COPIES):
                short.add({**meta, "case": "above", "copy": copy}, cases["above"])
                short.add({**meta, "case": "below", "copy": copy}, cases["below"])
    for j in C_BITS:  # lanes: tiny lost to big only at the multiples of the lane count
        for d in LANE_DISTANCES:
            for end in LANE_ENDS:
                short.add({"test": "lane", "j": j, "d": d, "end": end}, {0: mid, d: 2.0 ** (14 - j), end: -mid})
    short.add({"test": "accumulator_range"}, {0: 2.0**15, 1: 2.0**15, last: -(2.0**15)})
    short.add({"test": "overflow"}, {0: F16MAX, 1: 32.0})

    b = np.zeros(SPECIAL)
    special = _Builder("special", SPECIAL, b)
    for n in range(3, 22):
        i = (n - 1) // 2
        i2 = n - 1 - i
        c, c2 = 1.0 + 2.0**-i, 1.0 + 2.0**-i2
        # c * c2 = 1 + 2**-i + 2**-i2 + 2**-(i+i2): n = i + i2 + 1 significand bits
        b[4 * n: 4 * n + 4] = (1.0, c2, c2, 1.0)
        cancel = -(2.0**10) * (1.0 + 2.0**-i + 2.0**-i2)
        special.add({"test": "product", "n": n, "ordering": "cancel_first"}, {4 * n: cancel, 4 * n + 1: 2.0**10 * c})
        special.add({"test": "product", "n": n, "ordering": "product_first"}, {4 * n + 2: 2.0**10 * c, 4 * n + 3: cancel})
    b[100], b[101], b[102] = 2.0**10, 2.0**-10, 1.0
    special.add({"test": "subnormal_input"}, {100: 2.0**-24})
    special.add({"test": "subnormal_result"}, {101: 2.0**-7})
    special.add({"test": "subnormal_passthrough"}, {102: 2.0**-24})
    b[110], b[111], b[112] = 1.0, 1.0 - 2.0**-10, 1.0
    # (1 + 2**-10) + 2**-11 (1 - 2**-20) lies just below a tie: one rounding to fp16 goes down,
    # rounding to fp32 first lands on the tie and then rounds to even, up
    special.add({"test": "double_rounding"}, {110: 1.0 + 2.0**-10, 111: 2.0**-11 * (1.0 + 2.0**-10), 112: -(1.0 + 2.0**-10)})
    b[104], b[105] = F16MAX, -F16MAX
    special.add({"test": "product_overflow"}, {104: F16MAX, 105: F16MAX})

    maxg = _Builder("max", MAX_LEN, np.full(MAX_LEN, F16MAX))
    for d in DISTANCES:
        maxg.add({"test": "block_overflow", "d": d}, {0: F16MAX, d: -F16MAX})

    long = _Builder("long", LONG)
    for j in C_BITS:
        for d in DISTANCES:
            if d >= 2:
                long.add({"test": "block_bits", "j": j, "d": d}, {0: big, 1: 2.0 ** (15 - j), d: -big})
    for j in D_BITS:
        for d in DISTANCES:
            long.add({"test": "chunk", "j": j, "d": d}, {0: big, d: 2.0 ** (15 - j), LONG - 1: -big})
    for d in DISTANCES[1:]:
        long.add({"test": "block_alignment", "d": d}, {0: 2.0**10, 1: -(2.0**10), d: ALIGNED_X})
    # two calls per op (one XLA compilation each): rows of <= 128 terms and rows of 16384
    return (_merge("short", [short.build(), special.build()]), _merge("long", [maxg.build(), long.build()]))


# -- running (in the backend's process) -------------------------------------------
