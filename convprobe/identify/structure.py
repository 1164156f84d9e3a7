"""The structure of a reduction, measured with crafted inputs at the kernel's own shape.

Every output is made a test row: one operand is a constant s, the other carries
a chosen term value / s at each of the K positions, so the op computes
sum_k pattern[k] exactly as the kernel orders and rounds it (`measure_rows` takes
that runner: `layer_patterns` places rows in a conv layer's ops, `identify` in the
battery's). Only the values are crafted, never the shape. The measurements, each
a pure function of observed outputs:

- **segments** (`boundaries`): B at position 0, -B at K-1 and units u at j and
  j+1, with B + u a tie that stays B in the accumulator under test (`FP16_PROBE`:
  B = 2048, u = 1; `FP32_PROBE`: B = 2**13, u = 2**-11). The two units survive
  (output 2u) only when they meet each other before they meet B: j and j+1 share
  a partial sum (a chunk, a split-K range) that does not hold position 0.
  Sweeping j finds where every partial sum after the first starts. Wide chunks
  added to an fp16 total show as single lost pairs (`_narrow_totals`).
- **lanes**: B at 0 and units at 1 and 1 + d: with W interleaved accumulators
  (term k goes to k mod W) the ones meet each other first exactly when W | d.
- **direction** (`_directions`): B + u is a tie at B = +2048 but exact at -2048
  (the binade below has ulp 1), so in an fp16 accumulator B, u, -B in a row loses u
  only when B comes first, and its mirror -B, u, B only when B comes last. A kernel
  that sums from K-1 down (an input gradient that runs over a reversed dy) is measured
  on mirrored rows and its specs wrapped in ``reverse(...)``.
- **lanes tail** (`_lanes_tail`): with W lanes and no partial sums, for each of the last
  positions t: B at t mod W (t's lane), -B at t and a unit in the next lane. In its lane -B
  cancels B exactly and the unit survives; added after the lanes' combine, -B finds the
  unit already tied away into B, and leaves 0. The trailing run of such t is the tail (a
  depth loop unrolled into lanes that finishes its remainder on one accumulator).
- **narrow lanes, wide combine** (`_narrow_lanes`): B at 0 and one unit at j. Where
  fp16 lanes are summed in a wider format at the end (a SIMD dot product whose
  horizontal sum runs in fp32), the unit is lost exactly when W | j: only there does
  it share B's fp16 lane. The lane's own structure is then measured on lane 0 alone
  (every term at k = 0 mod W), as a reduction of K / W terms.
- **product rounding**: -(1 + 2**-10) then (1 + 2**-10)**2 in one accumulator:
  an exact (fused) product leaves 2**-10 + 2**-20, an fp16-rounded one 2**-10.
- **double rounding** (fp16 accumulators with exact products): a sum just below
  an fp16 tie that fp32 rounds onto the tie (`_additions_in_fp32`).

`convprobe.identify.candidates` turns the measured structure into emulator models,
which the battery and `layer_identify` then confirm (or not) on fresh inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import numpy as np

from convprobe.probes.fingerprint.properties import lost_at_multiples

__all__ = ["Structure", "measure_rows", "grids", "blocks", "best_of", "bitwise_equal"]

class Probe(NamedTuple):
    """B and the unit whose sum with B is a tie in the accumulator under test."""

    big: float
    unit: float


#: B = 2**11 for fp16 (ulp 2, unit 1); B = 2**13 for fp32 (ulp 2**-10, unit 2**-11): every
#: term an fp16 number, so a product rounded to fp16 changes none of them.
FP16_PROBE = Probe(2.0**11, 1.0)
FP32_PROBE = Probe(2.0**13, 2.0**-11)
MAX_LANES = 64
_SCALED = 1.0 + 2.0**-10


@dataclass
class Structure:
    """What the crafted inputs showed; `note` says why a measurement is missing."""

    accumulator: str | None = None  # "fp16", "fp32" or "wider than fp32"
    boundaries: list[int] | None = None  # K positions where a partial sum starts (0 excluded)
    lanes: int | None = None
    products_rounded: bool | None = None
    note: str = ""
    #: fp16 accumulators: each addition done in fp32 and rounded back (two roundings).
    additions_in_fp32: bool | None = None
    #: The format partial sums are added to the total in, where the starts show it.
    total: str | None = None
    #: Specs that follow from the op's layout where the crafted rows cannot be placed.
    derived: tuple[str, ...] = ()
    #: Narrow lanes summed in a wider format at the end: that format ("fp32"). The other
    #: fields then describe one lane (boundaries in K positions).
    combine: str | None = None
    #: The kernel sums from K-1 down: the other fields describe the mirrored rows.
    backwards: bool = False
    #: A filter gradient that sums its batch positions (oh, ow, n), the batch innermost, by
    #: a probe of the fields here (None: not measured); they are in (n, oh, ow) order.
    batch_innermost: bool | None = None
    #: A filter gradient over N > 1 images and OH * OW > 1 positions: the whole measurement
    #: again with the rows laid out (oh, ow, n) (`batch_order`), as a Structure dict. Lanes
    #: over that order hide it from the `batch_innermost` probe, so both orders give candidates.
    innermost: dict | None = None
    #: A stride-1 input gradient: the whole measurement again as the forward conv of dy
    #: with the rotated filter (`input_gradient_layout`: XLA's GEMM), as a Structure dict
    #: of that conv2d; both layouts give candidates.
    as_forward: dict | None = None
    #: The GEMM's columns measured one by one (`column_patterns`): runs of columns, each
    #: {"first": column, "structure": its Structure as a dict}; None: not measured.
    columns: list[dict] | None = None
    #: Why the columns were not measured ('' when they were).
    columns_note: str = ""
    #: Lanes: how many terms at the end are added after the lanes' combine (None: not measured).
    lanes_tail: int | None = None
    #: The GEMM's rows grouped by kernel (`tile_patterns`): runs of rows, each {"first": row,
    #: "columns": runs of columns as in `columns`, or None for the measured structure's own};
    #: None: every row is one kernel, or not measured.
    rows: list[dict] | None = None
    #: Why the rows were not measured ('' when they were or need not be).
    rows_note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)



#: Rows per `run` call while sweeping: the rows are K long, so a sweep is built in blocks.
_BLOCK = 256


def blocks(patterns: np.ndarray, capacity: int, scale: float) -> np.ndarray:
    """The rows as fp16 operands, `capacity` to a call: (calls, capacity, K), zero-padded."""
    out = np.zeros((-(-len(patterns) // capacity) * capacity, patterns.shape[1]), np.float16)
    rows, columns = np.nonzero(patterns)  # crafted rows are mostly zeros: convert only the rest
    out[rows, columns] = (patterns[rows, columns] / scale).astype(np.float16)
    return out.reshape(-1, capacity, patterns.shape[1])


def _row(k: int, test: Probe, origin: int, units, end: int | None = None) -> np.ndarray:
    """B at `origin`, -B at `end` (default K-1), a unit at each of `units`."""
    row = np.zeros(k)
    row[origin] += test.big
    row[k - 1 if end is None else end] -= test.big
    for j in units:
        row[j] += test.unit
    return row


def _kept(run, k: int, test: Probe, origin: int, pairs, end: int | None = None) -> np.ndarray:
    """For each (i, j): did the two units at i and j survive B at `origin` (output 2 units)?"""
    pairs = list(pairs)
    out = [run(np.stack([_row(k, test, origin, pair, end) for pair in pairs[i:i + _BLOCK]]))
           for i in range(0, len(pairs), _BLOCK)]
    return np.concatenate(out) == 2 * test.unit if out else np.zeros(0, dtype=bool)


def _kept_anywhere_end(run, k: int, test: Probe, pairs, last: int | None = None) -> np.ndarray:
    """`_kept` with -B at `last` (default K-1), `last` - 1 and `last` - 2 in turn, kept only if
    kept every time: with W lanes -B may share a lane with B or with a unit, and then the B's
    cancel before any rounding."""
    last = k - 1 if last is None else last
    return np.logical_and.reduce([_kept(run, k, test, 0, pairs, end) for end in (last, last - 1, last - 2)])


def _starts(run, k: int, test: Probe, origin: int, stop: int, lanes: int) -> list[int]:
    """Partial-sum starts in (origin, stop), from B at `origin`, -B at K-1 and units at j and
    j + lanes (one lane). Located to a multiple of `lanes` from the origin."""
    js = np.arange(origin + lanes, min(stop, k - 1) - lanes, lanes)
    if len(js) == 0:
        return []
    kept = _kept(run, k, test, origin, [(j, j + lanes) for j in js])
    if not kept.any():
        return []
    first = int(js[np.argmax(kept)])
    return [first, *(int(j) + lanes for j, ok in zip(js, kept) if j > first and not ok)]


def _boundaries(run, k: int, test: Probe, lanes: int) -> list[int]:
    """Every partial-sum start: a sweep from 0, then one from the start of each segment
    longer than the first, where a split-K range's own chunks hide from a B at 0."""
    found = _starts(run, k, test, 0, k, lanes)
    if not found:
        return []
    edges = [0, *found, k]
    for s, e in zip(edges[1:-1], edges[2:]):
        if e - s > found[0]:
            found += _starts(run, k, test, s, e, lanes)
    return sorted(set(found))


def _narrow_totals(run, k: int) -> list[int]:
    """Where a wide partial sum is added to an fp16 total: with B = 2048 in a wide first
    chunk every pair of units survives, except the pair split by a start (2049 and then 1
    each meet the fp16 total alone, and tie back to 2048)."""
    js = np.arange(1, k - 2)
    kept = _kept(run, k, FP16_PROBE, 0, [(j, j + 1) for j in js])
    return [int(j) + 1 for j, ok in zip(js, kept) if not ok]


def _lanes(run, k: int, test: Probe, last: int | None = None) -> int | None:
    """W from B at 0 and units at 1 and 1 + d: the units meet first exactly when W | d, up to
    the first multiple of W that is lost (a chunk ends there). -B goes at `last` or just
    before it (default: the end of the row)."""
    last = k - 1 if last is None else last
    ds = np.arange(1, min(MAX_LANES, last - 4) + 1)
    if len(ds) == 0:
        return 1
    kept = _kept_anywhere_end(run, k, test, [(1, 1 + d) for d in ds], last)
    if not kept.any():
        return 1
    width = int(ds[np.argmax(kept)])
    expected = ds % width == 0
    stop = next((i for i, (want, got) in enumerate(zip(expected, kept)) if want and not got), len(ds))
    return width if np.array_equal(kept[:stop], expected[:stop]) and not kept[stop:].any() else None


#: The last positions looked at for a lanes tail (each gets a row); a tail is found when at
#: least one of them lies inside the lanes, so the longest is MAX_TAIL - 1.
MAX_TAIL = 64


def _lanes_tail(run, k: int, test: Probe, lanes: int) -> int | None:
    """How many terms at the end are added after the lanes are combined (see the module
    docstring); None where the rows fit no trailing run, or every row fell in it."""
    ts = np.arange(max(lanes, k - MAX_TAIL), k)
    if lanes < 2 or len(ts) == 0:
        return None
    rows = np.zeros((len(ts), k))
    for r, t in enumerate(ts):
        rows[r, t % lanes] += test.big
        rows[r, t] -= test.big
        rows[r, (t + 1) % lanes] += test.unit
    got = run(rows)
    after, inside = got == 0.0, got == test.unit
    if after.all() or not (after | inside).all():
        return None
    start = int(np.flatnonzero(~after)[-1]) + 1  # where the trailing run of "after" begins
    return None if after[:start].any() else len(ts) - start


def _narrow_lanes(run, k: int) -> int | None:
    """W when a lone unit is lost to B at 0 exactly at the multiples of W (B's own fp16 lane),
    up to 2 * MAX_LANES; None when no unit is lost, or the losses are not such multiples."""
    js = np.arange(1, min(2 * MAX_LANES, k - 4) + 1)
    if len(js) == 0:
        return None
    kept = np.logical_and.reduce([
        np.concatenate([run(np.stack([_row(k, FP16_PROBE, 0, [j], end) for j in js[i:i + _BLOCK]]))
                        for i in range(0, len(js), _BLOCK)]) == FP16_PROBE.unit
        for end in (k - 1, k - 2, k - 3)])
    return lost_at_multiples(js, ~kept)


#: The direction triple is also placed this far apart: all in one lane of any lane count
#: that divides it, so a lane kernel's combine order is not taken for the terms' order.
_DIRECTION_SPACING = 16


def _directions(run, k: int) -> list[bool]:
    """Whether B, u, -B summed backwards: for the triple next to each other and, where K
    allows, 16 apart. Forward it gives 0 and its mirror -B, u, B gives u; backwards the
    other way round (see the module docstring); for fp16 and fp32 accumulators."""
    spacings = [1] + ([_DIRECTION_SPACING] if k > 2 * _DIRECTION_SPACING else [])
    rows = np.zeros((4 * len(spacings), k))
    for s, step in enumerate(spacings):
        for i, (big, unit) in enumerate((FP16_PROBE, FP32_PROBE)):
            rows[4 * s + 2 * i, [0, step, 2 * step]] = big, unit, -big
            rows[4 * s + 2 * i + 1, [0, step, 2 * step]] = -big, unit, big
    got = run(rows)
    return [any(got[4 * s + 2 * i] == unit and got[4 * s + 2 * i + 1] == 0.0
                for i, (_, unit) in enumerate((FP16_PROBE, FP32_PROBE)))
            for s in range(len(spacings))]


def _lane_zero(run, k: int, width: int):
    """A runner for rows of k // width terms placed at k = 0, width, 2 * width, ... (lane 0)."""
    def lane_run(patterns, scale):
        rows = np.zeros((len(patterns), k))
        rows[:, 0:k:width] = patterns
        return run(rows, scale)

    return lane_run


def _products_rounded(run, k: int, lanes: int) -> bool | None:
    """-(s) then s*s, s = 1 + 2**-10, in one accumulator (positions 0 and `lanes`)."""
    if lanes + 1 >= k:
        return None
    row = np.zeros(k)
    row[0], row[lanes] = -_SCALED, _SCALED * _SCALED
    got = run(row[None], _SCALED)[0]
    exact, rounded = 2.0**-10 + 2.0**-20, 2.0**-10
    return {exact: False, rounded: True}.get(float(got))


def _additions_in_fp32(run, k: int, lanes: int) -> bool | None:
    """16400 then 8 - 2**-17 in one fp16 accumulator, as (16384 and 8 - 2**-7) * (1 + 2**-10):
    the exact sum lies just below the tie 16408, so one rounding gives 16400; rounded to fp32
    first it lands on the tie, which goes to even: 16416."""
    if lanes + 1 >= k:
        return None
    row = np.zeros(k)
    row[0], row[lanes] = 16400.0, 8.0 - 2.0**-17
    got = float(run(row[None], _SCALED)[0])
    return {16400.0: False, 16416.0: True}.get(got)


#: Shortest reduction measured (accumulator and products only below `MIN_SWEPT_K`).
MIN_MEASURED_K = 4
#: Shortest reduction whose lanes and partial sums are swept: below it there is no room
#: for them (at K = 7 four lanes read as partial sums), so one chain is assumed.
MIN_SWEPT_K = 8
#: Longest reduction measured: a sweep runs K rows of K terms.
MAX_MEASURED_K = 16384


def measure_rows(run, k: int, mirrored: bool = False) -> Structure:
    """The structure of any reduction of length k: `run(patterns, scale)` must return
    sum_k patterns[r, k] for every row r, as the kernel computes it, from operands
    patterns / scale and a constant scale. `mirrored`: the rows are already mirrored
    (the direction is not tested again)."""
    if k < MIN_MEASURED_K:
        return Structure(note=f"K = {k} is too short to measure")
    if k > MAX_MEASURED_K:
        return Structure(note=f"K = {k} is above {MAX_MEASURED_K}: not measured (a sweep costs K**2 terms)")

    def quiet(patterns, scale):
        with np.errstate(over="ignore", invalid="ignore"):
            return run(patterns, scale)

    def sums(patterns):  # every B/unit term is an fp16 number: the constant operand is 1
        return quiet(patterns, 1.0)

    if not mirrored:
        directions = _directions(sums, k)
        if directions[0]:
            # Backwards next to each other but forward 16 apart: a lane kernel whose lanes are
            # combined last to first (its lanes then show), or backward chunks the wide triple
            # straddles (then the mirrored rows are measured).
            forward = _measure_forward(sums, quiet, k) if not all(directions) else None
            if forward is not None and forward.combine is not None:
                return forward
            backwards = measure_rows(lambda patterns, scale: run(np.ascontiguousarray(patterns[:, ::-1]), scale), k,
                                     mirrored=True)
            return replace(backwards, backwards=True)
    return _measure_forward(sums, quiet, k)


def _short_structure(sums, quiet, k: int) -> Structure:
    """A reduction too short to sweep: its accumulator, products and double rounding, as one chain."""
    note = f"K = {k} < {MIN_SWEPT_K}: lanes and partial sums not looked for (one chain assumed)"
    # B, two units, -B at the very end: one chain, and no room to move -B off the units
    if not _kept(sums, k, FP16_PROBE, 0, [(1, 2)], k - 1)[0]:
        rounded = _products_rounded(quiet, k, 1)
        return Structure("fp16", [], 1, rounded, note=note, total="fp16",
                         additions_in_fp32=_additions_in_fp32(quiet, k, 1) if rounded is False else None)
    if _kept(sums, k, FP32_PROBE, 0, [(1, 2)], k - 1)[0]:
        return Structure("wider than fp32", note="B + 2**-11 survived at B = 2**13: wider than fp32")
    return Structure("fp32", [], 1, _products_rounded(quiet, k, 1), note=note, total="fp32")


def _measure_forward(sums, quiet, k: int) -> Structure:
    """`measure_rows` for a kernel that sums from position 0 up."""
    if k < MIN_SWEPT_K:
        return _short_structure(sums, quiet, k)
    if not _kept_anywhere_end(sums, k, FP16_PROBE, [(1, 2)])[0]:  # B + 1 tied back to B: fp16
        return _fp16_structure(sums, quiet, k)
    width = _narrow_lanes(sums, k)
    if width is not None:
        return _lane_structure(quiet, k, width)
    totals = _narrow_totals(sums, k)
    last = totals[0] - 1 if totals else None  # cancel B inside the wide first chunk
    if last is not None and last < 8:
        return Structure(note=f"wide partial sums of {totals[0]} terms into an fp16 total: too short to measure")
    if _kept_anywhere_end(sums, k, FP32_PROBE, [(1, 2)], last)[0]:
        if totals:
            return Structure(note=f"wider than fp32 inside partial sums that start at {totals[:8]} ...")
        return Structure("wider than fp32", note="B + 2**-11 survived at B = 2**13: wider than fp32")
    lanes = _lanes(sums, k, FP32_PROBE, last)
    if lanes is None:
        return Structure("fp32", note="the lane sweep fits no interleaving k mod W")
    boundaries = totals or _boundaries(sums, k, FP32_PROBE, lanes)
    return Structure("fp32", boundaries, lanes, _products_rounded(quiet, k, lanes),
                     total="fp16" if totals else "fp32",
                     lanes_tail=None if boundaries else _lanes_tail(sums, k, FP32_PROBE, lanes))


def _fp16_structure(sums, quiet, k: int) -> Structure:
    """An fp16 accumulator: lanes, starts, the total's format, products and double rounding.
    An fp32 total hides every start after the first from B at 0 (units at n and K-2 both
    survive): then the chunks are taken as every n, which the confirmation checks."""
    lanes = _lanes(sums, k, FP16_PROBE)
    if lanes is None:
        return Structure("fp16", note="the lane sweep fits no interleaving k mod W")
    boundaries, total, note = _boundaries(sums, k, FP16_PROBE, lanes), "fp16", ""
    if boundaries and boundaries[0] < k - 2 and _kept(sums, k, FP16_PROBE, 0, [(boundaries[0], k - 2)])[0]:
        n = boundaries[0]
        if len(boundaries) > 1 or n * 2 < k:
            total, note = "fp32", "fp32 total: starts after the first are taken as every n"
        boundaries = list(range(n, k, n))
    rounded = _products_rounded(quiet, k, lanes)
    return Structure("fp16", boundaries, lanes, rounded, note=note, total=total,
                     additions_in_fp32=_additions_in_fp32(quiet, k, lanes) if rounded is False else None,
                     lanes_tail=None if boundaries else _lanes_tail(sums, k, FP16_PROBE, lanes))


def _lane_structure(quiet, k: int, width: int) -> Structure:
    """fp16 lanes of `width` summed wide: lane 0 measured as its own fp16 reduction."""
    terms = -(-k // width)  # in lane 0
    if terms < 8:  # too short to look for chunks inside a lane: its products and additions only
        rounded = _products_rounded(quiet, k, width)
        return Structure("fp16", [], width, rounded, total="fp16", combine="fp32",
                         additions_in_fp32=_additions_in_fp32(quiet, k, width) if rounded is False else None,
                         note=f"{terms} terms in lane 0: no partial-sum starts looked for inside it")
    lane_quiet = _lane_zero(quiet, k, width)
    lane = _fp16_structure(lambda patterns: lane_quiet(patterns, 1.0), lane_quiet, terms)
    if lane.lanes != 1:  # accumulators inside the lane: not modelled yet
        return Structure("fp16", lanes=width, combine="fp32",
                         note=f"fp16 lanes of {width} summed wide; inside a lane: {lane.note or f'lanes={lane.lanes}'}")
    bounds = None if lane.boundaries is None else [b * width for b in lane.boundaries]
    return Structure("fp16", bounds, width, lane.products_rounded, note=lane.note, additions_in_fp32=lane.additions_in_fp32,
                     total=lane.total, combine="fp32")


def grids(boundaries: list[int], k: int, lanes: int = 1) -> tuple[int | None, int | None] | None:
    """(split-K range length, chunk length) whose grids give exactly these boundaries: chunks
    of n from 0 (the last may be shorter), or ranges of P each chunked by n from its own
    start. (None, None) for no boundary; None when no such pair fits."""
    if not boundaries:
        return None, None
    n = boundaries[0]
    outer = next((b for b in boundaries if b % n), None)
    starts = range(0, k, outer) if outer else [0]
    span = outer or k
    expected = sorted({m for s in starts for m in range(s + n, min(s + span, k), n)} | set(starts[1:]))
    visible = k - 2 - lanes  # a start this close to the end has no room for its pair of units
    return (outer, n) if [m for m in expected if m <= visible] == [m for m in boundaries if m <= visible] else None


def best_of(scores: dict[str, float]) -> str:
    """The spec with the highest score, the earliest on ties (the measured ones come first)."""
    order = list(scores)
    return max(order, key=lambda spec: (scores[spec], -order.index(spec)))


def bitwise_equal(predicted: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """fp16 bit patterns equal, NaNs matching NaNs of any payload."""
    nan = np.isnan(predicted.view(np.float16)) & np.isnan(observed.view(np.float16))
    return (predicted == observed) | nan
