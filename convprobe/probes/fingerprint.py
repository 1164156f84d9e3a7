"""The fingerprint battery: crafted sums that reveal how an op really accumulates.

Every test is a sum of a few crafted fp16 products placed at chosen positions
along the reduction axis (zeros elsewhere), run through an op as M independent
dot products (`fingerprint_ops.reduce_rows`). What each test decides:

- accumulator_bits - significand bits a partial sum keeps. Row j sums
  big = 2**15, tiny = 2**(15-j) and -big; tiny survives iff the partial sum
  big + tiny was representable, i.e. j <= p - 1 (j = p is a tie that
  nearest-even and truncation both lose). p = 1 + the largest j up to which every
  tiny survived; >= 40 means no rounding was seen (fp16 inputs cannot show
  more). Measured in four orderings: `spread` (big, tiny first, -big last),
  `adjacent` (three in a row), `reversed` (mirror of spread, for reductions
  that run backwards) and `cancel_first` (big, -big, tiny), which cancels before
  any rounding and so *hides* a narrow accumulator: order matters.
  The accumulator is the narrowest of the first three; `adjacent` wider than
  `spread` means a fused multi-term adder (block FMA) whose alignment keeps
  `extra_bits` more bits than its accumulator.
- rounding - at the measured p: big = 1.5 * 2**15, t = 0.75, 0.25 and 0.5 ulp
  (ties on an even and on an odd last bit), and -(big + 0.75 ulp); 16 copies of
  the 0.75 and 0.25 rows expose stochastic rounding (copies disagree).
- product_bits - (1 + 2**-i)(1 + 2**-i2) * 2**10 needs n = i + i2 + 1
  significand bits; added to -(1 + 2**-i + 2**-i2) * 2**10 it leaves
  2**(10-i-i2) iff the product was kept (n = 3..21); both operand orders, the
  best counts (an fp16 accumulator loses it in one order).
- double_rounding - for an fp16 accumulator: (1 + 2**-10) + 2**-11 (1 - 2**-20)
  is just below a tie; added in fp32 first it lands on the tie and rounds to
  even, up (an fp16 add done as float-add-then-convert, as CPU half types do).
- subnormal inputs (2**-24 * 2**10) and results (2**-7 * 2**-10 = 2**-17): kept
  or flushed to zero.
- overflow - 65504 + 32 = 65536 becomes inf or saturates to 65504;
  accumulator_range - 65504 + 65504 - 65504 is inf/0 in an fp16-range
  accumulator, 65504 in a wider one; product_overflow - the 65519 test
  (0 wide, inf fp16 fused chain, NaN fp16 products).
- block_size - +P and -P (P = 65504**2) at distance d: a fused block holding
  both gives 0, separate accumulation steps overflow (inf; NaN when two
  partial sums overflow separately: a tree). The smallest d that overflows is the
  block size; for wide accumulators with extra alignment bits the same sweep
  runs on tiny = 2**(15-(p+1)) between big and -big at distance d. Where neither
  shows a block, the alignment sweep does: 2**10 and -2**10 first, then
  x = 2**-8 + 2**-18 at distance d. A truncating block adder aligns x to 2**10 and
  drops its last bit while x shares a block with them, and keeps x whole once it
  starts a block of its own: the first d that keeps x is the block size.
- chunk_size - big first, -big last, tiny at distance d: tiny survives once it
  starts a new chunk that is summed separately and promoted to a wider total.

References: the 65519 test (DESIGN.md); block FMA models of tensor cores
(Fasi, Higham, Mikaitis & Pranesh, PeerJ Comput. Sci. 7:e330, 2021); chunked
accumulation (Blanchard et al., SIAM J. Sci. Comput. 42(3), 2020).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from convprobe.probes.fingerprint_ops import QUADRATIC_LIMIT, QUADRATIC_OPS, base_op, check_ops, reduce_many

__all__ = [
    "PROPERTIES",
    "ORDERINGS",
    "DISTANCES",
    "Group",
    "battery",
    "run",
    "infer",
    "interpret",
    "run_battery",
    "fingerprint_backend",
    "expected_properties",
    "resolved_size",
]

#: The inferred properties, in table order.
PROPERTIES = (
    "accumulation", "accumulator_bits", "extra_bits", "rounding", "double_rounding", "product_bits",
    "subnormal_inputs", "subnormal_results", "overflow", "accumulator_range",
    "product_overflow", "block_size", "chunk_size",
)

ORDERINGS = ("spread", "adjacent", "reversed", "cancel_first")
MAX_J = 38  # tiny = 2**(14 - j) must stay an fp16 number (>= 2**-24)
ROUNDING_P = range(2, 39)  # ulp = 2**(16 - p) and 0.25 ulp must be fp16 numbers
COPIES = 16  # 16 stochastic roundings of +0.75 ulp all go up w.p. 0.75**16 ~ 1%; with the 0.25 rows ~ 1e-4
SHORT = 64
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
    }[ordering]


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
        cases = {
            "above": {0: rbig, 1: 0.75 * ulp, last: -rbig},
            "below": {0: rbig, 1: 0.25 * ulp, last: -rbig},
            "tie_even": {0: rbig, 1: 0.5 * ulp, last: -rbig},
            "tie_odd": {0: rbig, 1: ulp, 2: 0.5 * ulp, last - 1: -ulp, last: -rbig},
            "neg_above": {0: -rbig, 1: -0.75 * ulp, last: rbig},
        }
        for case, terms in cases.items():
            short.add({"test": "rounding", "p": p, "case": case, "copy": 0}, terms)
        for copy in range(1, COPIES):
            short.add({"test": "rounding", "p": p, "case": "above", "copy": copy}, cases["above"])
            short.add({"test": "rounding", "p": p, "case": "below", "copy": copy}, cases["below"])
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


def run_battery(backend, op: str) -> dict[str, np.ndarray]:
    """Outputs of every group through `op` on `backend`, as float64 arrays.

    Ops whose cost grows as L**2 skip the long groups: their block and chunk
    sizes read "not run".
    """
    calls = _calls(op)
    outputs = reduce_many(backend, op, [(g.a, g.b, g.channel) for g in calls])
    return {g.name: np.asarray(y, dtype=np.float64) for g, y in zip(calls, outputs)}


def _calls(op: str) -> list[Group]:
    return [g for g in battery() if not (op in QUADRATIC_OPS and g.a.shape[1] > QUADRATIC_LIMIT)]


def run_all(backend, ops) -> dict[str, dict[str, np.ndarray]]:
    """`run_battery` for every op in one `reduce_many` (one XLA compilation for the lot)."""
    plan = [(op, g) for op in ops for g in _calls(op)]
    outputs = reduce_many(backend, [op for op, _ in plan], [(g.a, g.b, g.channel) for _, g in plan])
    result: dict[str, dict[str, np.ndarray]] = {op: {} for op in ops}
    for (op, g), y in zip(plan, outputs):
        result[op][g.name] = np.asarray(y, dtype=np.float64)
    return result


def run(backend, *, ops="conv2d", jit_variants=None, **_params) -> dict:
    """Run the battery through each op; JSON-able outputs (repr strings) or why an op failed.

    All ops go through the backend together (one XLA compilation); if that fails,
    each op runs alone so that one failing op cannot hide the others.
    `jit_variants` ([False, True]) runs a TensorFlow backend once per jit
    setting in this same process - configurations whose environments are equal
    differ only by jit_compile, which is per function, not per process - and
    returns {"variants": {"False": ..., "True": ...}}.
    """
    if jit_variants is not None:
        from convprobe.backends.tensorflow import TensorFlowBackend

        if not isinstance(backend, TensorFlowBackend):
            from convprobe.errors import InvalidArgument

            raise InvalidArgument("jit_variants applies to the TensorFlow backend only")
        return {"variants": {
            str(bool(jit)): run(TensorFlowBackend(backend.device, jit_compile=bool(jit)), ops=ops)
            for jit in jit_variants
        }}
    return _run_ops(backend, ops)


def _run_ops(backend, ops) -> dict:
    from convprobe.errors import UnsupportedConfiguration

    ops = check_ops(ops)
    together = None
    if len(ops) > 1 and all(base_op(op) in getattr(backend, "capabilities", ()) for op in ops):
        try:
            together = run_all(backend, ops)
        except Exception:  # noqa: BLE001 - fall back to one op at a time, which reports the culprit
            together = None
    results = {}
    for op in ops:
        try:
            outputs = together[op] if together is not None else run_battery(backend, op)
            results[op] = {"status": "ok", "outputs": {k: [repr(float(v)) for v in vals] for k, vals in outputs.items()}}
        except UnsupportedConfiguration as exc:
            results[op] = {"status": "unsupported", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one failing op must not hide the others
            results[op] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"ops": results}


# -- inference (in the parent) --------------------------------------------------


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or x == y


def _bits_for(values: dict[int, float], big_exp: int = 15) -> int:
    """1 + the largest j such that every tiny 2**(15-j') with j' <= j survived."""
    j = 0
    while j + 1 in values and values[j + 1] == 2.0 ** (big_exp - (j + 1)):
        j += 1
    return j + 1


def _fmt_bits(bits: int) -> str:
    return f">={MAX_J + 1}" if bits > MAX_J else str(bits)


def _accumulation_name(bits: int) -> str:
    return {8: "bf16", 11: "fp16", 24: "fp32"}.get(bits, "exact/wide" if bits > MAX_J else f"{bits}-bit")


def infer(outputs: dict[str, np.ndarray]) -> dict[str, dict[str, str]]:
    """Outputs of `run_battery` -> {property: {"value": str, "evidence": str}}."""
    groups = {g.name: g for g in battery() if g.name in outputs}
    obs: dict[tuple, float] = {}
    for name, g in groups.items():
        vals = outputs[name]
        for meta, v in zip(g.rows, vals):
            obs[tuple(sorted(meta.items()))] = float(v)

    def get(**meta) -> float:
        return obs[tuple(sorted(meta.items()))]

    out: dict[str, dict[str, str]] = {}

    def put(prop: str, value, evidence: str) -> None:
        out[prop] = {"value": str(value), "evidence": evidence}

    # accumulator bits per ordering
    per_order = {o: _bits_for({j: get(test="bits", ordering=o, j=j) for j in range(1, MAX_J + 1)}, 14) for o in ORDERINGS}
    revealing = {o: per_order[o] for o in ("spread", "adjacent", "reversed")}
    p = min(revealing.values())
    order_text = ", ".join(f"{o} {_fmt_bits(b)}" for o, b in per_order.items())
    put("accumulator_bits", _fmt_bits(p),
        f"1.5*2**14 + 2**(14-j) - 1.5*2**14 keeps 2**(14-j) up to j = {min(p, MAX_J + 1) - 1}; bits by ordering: {order_text}")
    accumulation_evidence = f"{_fmt_bits(p)} significand bits in partial sums"
    extra = per_order["adjacent"] - per_order["spread"] if per_order["adjacent"] <= MAX_J else 0
    put("extra_bits", max(0, extra),
        "adjacent (one fused step) keeps more bits than spread: a multi-term adder with extra alignment bits"
        if extra > 0 else "adjacent and spread keep the same bits (or adjacent never rounded: terms met in another order)")

    # rounding
    if p in ROUNDING_P:
        ulp = 2.0 ** (16 - p)
        above = [get(test="rounding", p=p, case="above", copy=c) for c in range(COPIES)]
        below = [get(test="rounding", p=p, case="below", copy=c) for c in range(COPIES)]
        tie_even = get(test="rounding", p=p, case="tie_even", copy=0)
        tie_odd = get(test="rounding", p=p, case="tie_odd", copy=0)
        neg = get(test="rounding", p=p, case="neg_above", copy=0)
        ev = (f"at p={p} (ulp {ulp:g} at 1.5*2**15): +0.75ulp -> {above[0]:g}, +0.25ulp -> {below[0]:g}, "
              f"tie on even -> {tie_even:g}, tie on odd -> {tie_odd:g}, -0.75ulp -> {neg:g}")
        if len(set(above)) > 1 or len(set(below)) > 1:
            ups = sum(v == ulp for v in above)
            put("rounding", "stochastic", ev + f"; the 0.75ulp row rounded up in {ups} of {COPIES} identical copies")
        elif above[0] == ulp and neg == -ulp and below[0] == 0:
            mode = "nearest_even" if (tie_even == 0 and tie_odd == ulp) else (
                "nearest_away" if (tie_even == ulp and tie_odd == ulp) else "nearest_other")
            put("rounding", mode, ev)
        elif above[0] == 0 and neg == 0:
            put("rounding", "toward_zero", ev)
        elif above[0] == ulp and neg == 0:
            put("rounding", "toward_+inf", ev)
        elif above[0] == 0 and neg == -ulp:
            put("rounding", "toward_-inf", ev)
        else:
            put("rounding", "unknown", ev)
    else:
        put("rounding", "n/a", f"no partial-sum rounding observed within {MAX_J} bits")

    # products
    kept = {n: max(get(test="product", n=n, ordering=o) == 2.0 ** (11 - n)
                   for o in ("cancel_first", "product_first")) for n in range(3, 22)}
    n = 2
    while n + 1 in kept and kept[n + 1]:
        n += 1
    if n == 21:
        put("product_bits", "exact", "products needing up to 21 significand bits were all kept (exact for fp16 inputs)")
    else:
        put("product_bits", n, f"a product of two fp16 numbers needing {n + 1} significand bits lost its last bit")

    # double rounding: only meaningful for an 11-bit (fp16) accumulator
    dr = get(test="double_rounding")
    if out["product_bits"]["value"] != "exact":
        put("double_rounding", "n/a", "products are rounded: the crafted product is not the value added")
    elif out["rounding"]["value"] == "stochastic":
        put("double_rounding", "n/a", "stochastic rounding: one crafted sum cannot tell")
    elif p == 11:
        put("double_rounding", "yes" if dr == 2.0**-10 else "no" if dr == 0.0 else f"unexpected {dr!r}",
            f"(1+2**-10) + 2**-11(1-2**-20) - (1+2**-10) -> {dr!r}: 0 = one rounding to fp16, 2**-10 = rounded "
            "through a wider format onto the tie first")
    else:
        put("double_rounding", "n/a", "the test is built for an 11-bit accumulator")

    name = _accumulation_name(p)
    if out["product_bits"]["value"] not in ("exact",):
        name += f", products to {out['product_bits']['value']} bits"
    put("accumulation", name, accumulation_evidence)

    sub_in = get(test="subnormal_input")
    put("subnormal_inputs", "kept" if sub_in == 2.0**-14 else "flushed" if sub_in == 0 else f"unexpected {sub_in!r}",
        f"2**-24 * 2**10 -> {sub_in!r}")
    sub_out = get(test="subnormal_result")
    put("subnormal_results", "kept" if sub_out == 2.0**-17 else "flushed" if sub_out == 0 else f"unexpected {sub_out!r}",
        f"2**-7 * 2**-10 -> {sub_out!r}")

    ovf = get(test="overflow")
    put("overflow", "inf" if ovf == math.inf else "saturate" if ovf == F16MAX else f"unexpected {ovf!r}",
        f"65504 + 32 -> {ovf!r}")
    rng = get(test="accumulator_range")
    put("accumulator_range",
        "wider than fp16" if rng == 2.0**15 else "fp16" if (math.isinf(rng) or rng == F16MAX - 2.0**15) else f"unexpected {rng!r}",
        f"2**15 + 2**15 - 2**15 -> {rng!r} (2**16 overflows fp16; saturation gives 65504 - 2**15)")
    pov = get(test="product_overflow")
    put("product_overflow",
        "0 (wide or fused)" if pov == 0.0 else "inf (fp16 fused chain)" if math.isinf(pov) else
        "NaN (fp16 products)" if math.isnan(pov) else "saturated (fp16 chain)" if abs(pov) == F16MAX else repr(pov),
        f"65504*65504 - 65504*65504 -> {pov!r}")

    # block size: overflow sweep, then the precision sweep
    if "long" not in outputs:
        put("block_size", "not run", "rows of 8192 and 16384 terms were not run for this op")
        put("chunk_size", "not run", "rows of 16384 terms were not run for this op")
        return {prop: out[prop] for prop in PROPERTIES}
    sweep = {d: get(test="block_overflow", d=d) for d in DISTANCES}
    separated = [d for d in DISTANCES if sweep[d] != 0.0]
    text = ", ".join(f"d={d}: {sweep[d]!r}" for d in DISTANCES[:8]) + ", ..."
    zero = {d for d in DISTANCES if sweep[d] == 0.0}
    if separated and math.isnan(pov):
        put("block_size", "n/a", "products overflow on their own (see product_overflow): the +P/-P sweep says nothing")
    elif separated and _lanes(zero):
        put("block_size", f"lanes={_lanes(zero)}",
            f"+P and -P cancel exactly when d is a multiple of {_lanes(zero)}: terms k mod {_lanes(zero)} share an "
            f"accumulator (interleaved SIMD partial sums); {text}")
    elif separated:
        first = separated[0]
        prev = max([d for d in DISTANCES if d < first], default=0)
        if math.isnan(sweep[first]):
            value = "tree"
        elif first == 1:
            value = "1"
        else:
            value = str(first) if prev == first - 1 else f"({prev},{first}]"
        put("block_size", value, f"+P and -P at distance d: {text}; first separated at d={first}")
    else:
        j = p + 1
        if p <= MAX_J and j in C_BITS:
            tiny = 2.0 ** (15 - j)
            swept = [d for d in DISTANCES if d >= 2]
            kept = {d for d in swept if get(test="block_bits", j=j, d=d) == tiny}
            lost = [d for d in swept if d not in kept]
            evidence = f"2**15 + 2**(15-{j}) - 2**15 at distance d keeps the tiny term at d in {sorted(kept)[:6]}"
            if kept and lost and _lanes(kept | {1}):
                put("block_size", f"lanes={_lanes(kept | {1})}",
                    f"{evidence}...: terms k mod {_lanes(kept | {1})} share an accumulator (interleaved SIMD partial sums)")
            elif kept and lost and all(d in kept for d in swept if d < lost[0]) and all(d not in kept for d in swept if d >= lost[0]):
                first = lost[0]
                prev = max([d for d in DISTANCES if d < first], default=0)
                put("block_size", str(first) if prev == first - 1 else f"({prev},{first}]",
                    f"2**15 + 2**(15-{j}) - 2**15 at distance d keeps the tiny term until d={first}")
            elif kept and lost:
                put("block_size", "irregular", f"{evidence}...: neither a block nor lanes")
            else:
                _alignment_block(get, put, f"+P/-P never overflowed and a bit beyond the accumulator was {'always' if not lost else 'never'} kept")
        else:
            _alignment_block(get, put, "+P/-P never overflowed (no fp16-range accumulation stage)")

    # chunk size
    j = p + 1
    if j in D_BITS:
        tiny = 2.0 ** (15 - j)
        kept_at = [d for d in DISTANCES if get(test="chunk", j=j, d=d) == tiny]
        if kept_at and kept_at[0] > 1 and all(d in kept_at for d in DISTANCES if kept_at[0] <= d <= 4096):
            first = kept_at[0]
            prev = max([d for d in DISTANCES if d < first], default=0)
            put("chunk_size", str(first) if prev == first - 1 else f"({prev},{first}]",
                f"2**15 first, -2**15 last, 2**(15-{j}) at distance d survives from d={first} (a new chunk with a wider total)")
        else:
            put("chunk_size", "n/a", f"2**(15-{j}) {'never' if not kept_at else 'always'} survived at any distance")
    else:
        put("chunk_size", "n/a", "accumulator too wide for the chunk test")
    return {prop: out[prop] for prop in PROPERTIES}


def _lanes(same: set[int]) -> int | None:
    """W >= 2 if the distances in `same` are exactly the swept multiples of W (d=1 ignored)."""
    candidates = sorted(d for d in same if d >= 2)
    if not candidates:
        return None
    width = candidates[0]
    multiples = {d for d in DISTANCES if d >= 2 and d % width == 0}
    return width if set(candidates) == multiples and len(multiples) >= 3 else None


def _decode(op_result: dict) -> dict[str, np.ndarray]:
    return {k: np.array([float(v) for v in vals]) for k, vals in op_result["outputs"].items()}


def infer_observed(observed: dict) -> dict[str, dict]:
    """{op: {"status", "error", "properties"}} from `run`'s observations."""
    per_op = {}
    for op, result in observed.get("ops", {}).items():
        if result.get("status") == "ok":
            per_op[op] = {"status": "ok", "error": None, "properties": infer(_decode(result))}
        else:
            per_op[op] = {"status": result.get("status", "failed"), "error": result.get("error"), "properties": {}}
    return per_op


def interpret(observed: dict) -> dict:
    """The runner's one-line view: accumulation per op; details stay in `infer_observed`."""
    if "variants" in observed:
        return {"accumulation": "unknown", "arithmetic": "", "verdict": "several jit variants (see run_grouped)",
                "evidence": ""}
    per_op = infer_observed(observed)
    accs = {op: r["properties"]["accumulation"]["value"] if r["status"] == "ok" else r["status"] for op, r in per_op.items()}
    distinct = set(accs.values())
    accumulation = distinct.pop() if len(distinct) == 1 and not distinct & {"unsupported", "failed"} else "mixed"
    accumulation = {"exact/wide": "fp32"}.get(accumulation, accumulation)
    summary = ", ".join(f"{op} {a}" for op, a in accs.items())
    return {
        "accumulation": accumulation if accumulation in ("fp16", "fp32", "bf16") else ("mixed" if len(accs) > 1 else "unknown"),
        "arithmetic": summary,
        "verdict": summary,
        "evidence": "; ".join(
            f"{op}: {r['properties']['accumulator_bits']['evidence']}" for op, r in per_op.items() if r["status"] == "ok"
        ),
    }


def fingerprint_backend(backend, op: str = "matmul") -> dict[str, str]:
    """In-process fingerprint of one op: {property: value} (the self-check's entry point)."""
    return {k: v["value"] for k, v in infer(run_battery(backend, op)).items()}


def _alignment_block(get, put, before: str) -> None:
    """block_size from the alignment sweep (see the module docstring), or n/a."""
    swept = DISTANCES[1:]
    kept = [d for d in swept if get(test="block_alignment", d=d) == ALIGNED_X]
    shown = ", ".join(f"d={d}: {'kept' if d in kept else 'lost'}" for d in swept[:8])
    if kept and kept[0] > swept[0] and all(d in kept for d in swept if d >= kept[0]):
        first = kept[0]
        prev = max(d for d in DISTANCES if d < first)
        put("block_size", str(first) if prev == first - 1 else f"({prev},{first}]",
            f"{before}; 2**10 - 2**10 + x: x's last bit is truncated while x shares a block with "
            f"2**10 and kept from d={first} on ({shown}, ...): blocks of {first} fused products")
    else:
        put("block_size", "n/a", f"{before}; 2**10 - 2**10 + x kept x at every d >= 2" if
            len(kept) == len(swept) else f"{before}; alignment sweep irregular ({shown}, ...)")


# -- what a model should give (the self-check's expectation) -----------------------


def resolved_size(size: int) -> str:
    """How the distance sweep reports a true block or chunk size: exact, or the interval
    (previous swept distance, first swept distance >= size]."""
    first = min(d for d in DISTANCES if d >= size)
    prev = max((d for d in DISTANCES if d < first), default=0)
    return str(first) if prev == first - 1 else f"({prev},{first}]"


def expected_properties(model) -> dict[str, str]:
    """The fingerprint an emulator model must produce, derived from its parameters alone."""
    from convprobe.emulation import Blocked, Chunked, Exact, Pairwise

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
        "accumulation": _accumulation_name(p) + ("" if products == "exact" else f", products to {products} bits"),
        "accumulator_bits": _fmt_bits(p),
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



def run_grouped(configs, params: dict, *, timeout: float, jobs: int | None = None) -> list:
    """`runner.run_probe('fingerprint', ...)` with one child per distinct environment.

    TensorFlow configurations that differ only in jit_compile share a process
    (one TensorFlow import instead of two); every configuration still gets its
    own `ProbeResult`, in the order given, with a crashed child marking all of
    its configurations.
    """
    import dataclasses

    from convprobe.probes.runner import annotate, run_many, run_one

    groups: dict[tuple, list] = {}
    for config in configs:
        key = (config.backend, config.device, tuple(sorted(config.env.items())), config.model)
        groups.setdefault(key, []).append(config)
    leaders, leader_params = [], []
    for members in groups.values():
        leaders.append(members[0])
        jits = sorted({c.jit_compile for c in members})
        grouped = members[0].backend == "tensorflow" and len(jits) > 1
        leader_params.append({**params, "jit_variants": jits} if grouped else params)
    results_by_leader = dict(enumerate(run_many(
        lambda pair: run_one("fingerprint", pair[0], pair[1], timeout=timeout),
        list(zip(leaders, leader_params)), jobs=jobs, description="fingerprint: processes")))
    out = []
    for config in configs:
        i = next(n for n, members in enumerate(groups.values()) if config in members)
        result = results_by_leader[i]
        observed = result.observed
        if result.status == "ok" and "variants" in observed:
            observed = observed["variants"][str(bool(config.jit_compile))]
        copy = dataclasses.replace(result, config=config, observed=observed)
        if copy.status == "ok":
            annotate(copy, interpret(observed))
        out.append(copy)
    return out

