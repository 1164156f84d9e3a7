"""The structure of a layer op's reduction, measured with crafted inputs at its own shape.

Every output of the op is made a test row: one operand is a constant s, the
other carries a chosen term value / s at each of the K positions (`rows`), so
the op computes sum_k pattern[k] exactly as the kernel orders and rounds it.
The kernel's shape - M, N, K, and so its blocking and threading - is the
layer's; only the values are crafted. Three measurements, each a pure function
of observed outputs:

- **segments** (`boundaries`): B = 2**(p+1) at position 0, -B at K-1 and ones at
  j and j+1. In a p-bit accumulator B + 1 is a tie that stays B, so the two ones
  survive (output 2) only when they meet each other before they meet B: j and
  j+1 share a partial sum (a chunk, a split-K range) that does not hold
  position 0. Sweeping j finds where every partial sum after the first starts.
  p = 11 (B = 2048) tests an fp16 accumulator, p = 24 (B = 2**24) an fp32 one.
- **lanes**: B at 0 and ones at 1 and 1 + d: with W interleaved accumulators
  (term k goes to k mod W) the ones meet each other first exactly when W | d.
- **product rounding**: -(1 + 2**-10) then (1 + 2**-10)**2 in one accumulator:
  an exact (fused) product leaves 2**-10 + 2**-20, an fp16-rounded one 2**-10.
- **double rounding** (fp16 accumulators with exact products): a sum just below
  an fp16 tie that fp32 rounds onto the tie (`_additions_in_fp32`).

`candidate_specs` turns the measured structure into emulator specs, which
`layer_identify` then confirms (or not) on random inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from convprobe.probes.layers import Layer

__all__ = ["Structure", "measure", "measure_rows", "grids", "candidate_specs", "pattern_outputs", "pattern_rows"]

#: (accumulator name, B exponent p + 1, constant operand s): B = 2**(p+1) = product s * (B / s).
_TESTS = (("fp16", 11, 1.0), ("fp32", 24, 2.0**12))
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
    #: Specs that follow from the op's layout where the crafted rows cannot be placed.
    derived: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def chunk(self) -> int | None:
        """The chunk length when the boundaries are its multiples (the last chunk may be
        shorter); None when they are irregular or absent."""
        if not self.boundaries:
            return None
        n = self.boundaries[0]
        return n if self.boundaries == list(range(n, n * (len(self.boundaries) + 1), n)) else None


def _first(candidates, valid) -> int | None:
    return next((c for c in candidates if all(valid(c))), None)


def _spot(layer: Layer, op: str) -> tuple[int, int] | None:
    """Where the crafted rows are read: a forward output (or, for the input gradient, an
    input position) whose window lies wholly inside the image, or for the filter gradient a
    tap that every output reads inside it. None if the layer has none."""
    from convprobe.emulation.conv import resolve_padding

    _, h, w, _ = layer.input_shape
    kh, kw, _, _ = layer.filter_shape
    _, oh, ow, _ = layer.output_shape
    pads = resolve_padding(layer.padding, (h, w), (kh, kw), layer.strides, layer.dilation)
    spots = []
    for size, k, out, s, d, (top, _) in zip((h, w), (kh, kw), (oh, ow), layer.strides, layer.dilation, pads):
        if op == "conv2d":
            spots.append(_first(range(out), lambda o: (0 <= o * s - top + t * d < size for t in range(k))))
        elif op == "conv2d_backprop_input":  # stride 1: dx[i] reads dy[i + top - t*d]
            spots.append(_first(range(size), lambda i: (0 <= i + top - t * d < out for t in range(k))))
        else:
            spots.append(_first(range(k), lambda t: (0 <= o * s - top + t * d < size for o in range(out))))
    return None if None in spots else (spots[0], spots[1])


def pattern_rows(layer: Layer, op: str) -> tuple[int, str]:
    """(test rows one call carries, '' or why this op cannot carry crafted rows)."""
    if op == "conv2d_backprop_input" and layer.strides != (1, 1):
        return 0, "a strided input gradient reads zeros between dy values: not measured"
    if _spot(layer, op) is None:
        return 0, "no output of this layer reads only in-bounds inputs: not measured"
    return (layer.input_shape[3] if op == "conv2d_backprop_input" else layer.filter_shape[3]), ""


def pattern_outputs(backend, layer: Layer, op: str, patterns: np.ndarray, scale: float) -> np.ndarray:
    """sum_k patterns[r, k] for each row r, computed by `op` at `layer`'s shape (see module
    docstring); rows beyond one call's capacity take several calls."""
    from convprobe.probes.layers import run_op

    capacity, why = pattern_rows(layer, op)
    if not capacity:
        raise ValueError(why)
    ph, pw = _spot(layer, op)
    c, (kh, kw, _, cout) = layer.input_shape[3], layer.filter_shape
    constant = {"conv2d": layer.input_shape, "conv2d_backprop_input": layer.output_shape,
                "conv2d_backprop_filter": layer.input_shape}[op]
    filled = np.full(constant, scale, np.float16)
    out = np.empty(len(patterns))
    for r0 in range(0, len(patterns), capacity):
        take = min(capacity, len(patterns) - r0)
        block = np.zeros((capacity, patterns.shape[1]))
        block[:take] = patterns[r0:r0 + take]
        values = (block / scale).astype(np.float16)
        if op == "conv2d":  # taps (i, j, c) in order
            got = run_op(backend, layer, op, filled, np.ascontiguousarray(values.T).reshape(layer.filter_shape))[0, ph, pw]
        elif op == "conv2d_backprop_input":  # taps (i, j, o) of the 180-degree rotated filter, in order
            w = values.reshape(c, kh, kw, cout)[:, ::-1, ::-1, :].transpose(1, 2, 0, 3)
            got = run_op(backend, layer, op, filled, np.ascontiguousarray(w))[0, ph, pw]
        else:  # positions (n, oh, ow) of the batch, in order
            dy = np.ascontiguousarray(values.T).reshape(layer.output_shape)
            got = run_op(backend, layer, op, filled, dy)[ph, pw, 0]
        out[r0:r0 + take] = got[:take].astype(np.float64)
    return out


def _row(k: int, big: float, origin: int, ones) -> np.ndarray:
    row = np.zeros(k)
    row[origin] += big
    row[k - 1] -= big
    for j in ones:
        row[j] += 1.0
    return row


def _starts(run, k: int, big: float, origin: int, stop: int, lanes: int) -> list[int]:
    """Partial-sum starts in (origin, stop), from B at `origin`, -B at K-1 and ones at j and
    j + lanes (one lane). Located to a multiple of `lanes` from the origin."""
    js = np.arange(origin + lanes, min(stop, k - 1) - lanes, lanes)
    if len(js) == 0:
        return []
    kept = run(np.stack([_row(k, big, origin, (j, j + lanes)) for j in js])) == 2.0
    if not kept.any():
        return []
    first = int(js[np.argmax(kept)])
    return [first, *(int(j) + lanes for j, ok in zip(js, kept) if j > first and not ok)]


def _boundaries(run, k: int, big: float, lanes: int) -> list[int]:
    """Every partial-sum start: a sweep from 0, then one from the start of each segment
    longer than the first, where a split-K range's own chunks hide from a B at 0."""
    found = _starts(run, k, big, 0, k, lanes)
    if not found:
        return []
    edges = [0, *found, k]
    for s, e in zip(edges[1:-1], edges[2:]):
        if e - s > found[0]:
            found += _starts(run, k, big, s, e, lanes)
    return sorted(set(found))


def _lanes(run, k: int, big: float) -> int | None:
    """W from B at 0 and ones at 1 and 1 + d: the ones meet first exactly when W | d."""
    ds = np.arange(1, min(MAX_LANES, k - 3) + 1)
    kept = run(np.stack([_row(k, big, 0, (1, 1 + d)) for d in ds])) == 2.0
    if not kept.any():
        return 1
    width = int(ds[np.argmax(kept)])
    return width if np.array_equal(kept, ds % width == 0) else None


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


def _layout_specs(layer: Layer, op: str) -> tuple[str, ...]:
    """An input gradient's K runs tap by tap over C_out output channels; where a strided layer
    keeps the crafted rows out, try the one-tap chunks that the measured stride-1 layers
    show (fp16 and fp32 accumulators)."""
    if op != "conv2d_backprop_input":
        return ()
    n = layer.filter_shape[3]
    return (f"chunked:fp16:n={n}:product=fp16:total=fp16", f"chunked:fp32:n={n}:total=fp32:output=fp16")


def measure(backend, layer: Layer, op: str) -> Structure:
    """The structure of `op` at `layer` (see the module docstring); never raises for a
    layer it cannot measure - the Structure's note says why."""
    capacity, why = pattern_rows(layer, op)
    if not capacity:
        return Structure(note=why, derived=_layout_specs(layer, op))
    return measure_rows(lambda patterns, scale: pattern_outputs(backend, layer, op, patterns, scale), layer.k(op))


def measure_rows(run, k: int) -> Structure:
    """The structure of any reduction of length k: `run(patterns, scale)` must return
    sum_k patterns[r, k] for every row r, as the kernel computes it, from operands
    patterns / scale and a constant scale."""
    if k < 8:
        return Structure(note=f"K = {k} is too short to measure")

    def quiet(patterns, scale):
        with np.errstate(over="ignore", invalid="ignore"):
            return run(patterns, scale)

    for name, exponent, scale in _TESTS:
        big = 2.0**exponent

        def sums(patterns, scale=scale):
            return quiet(patterns, scale)

        if sums(_row(k, big, 0, (1, 2))[None])[0] == 2.0:
            continue  # B + 1 was kept: the accumulator is wider than this test's
        lanes = _lanes(sums, k, big)
        if lanes is None:
            return Structure(name, note="the lane sweep fits no interleaving k mod W")
        rounded = _products_rounded(quiet, k, lanes)
        fp32_additions = _additions_in_fp32(quiet, k, lanes) if name == "fp16" and rounded is False else None
        return Structure(name, _boundaries(sums, k, big, lanes), lanes, rounded,
                         additions_in_fp32=fp32_additions)
    return Structure("wider than fp32", note="B + 1 survived at B = 2**24: the accumulator is wider than fp32")


def grids(boundaries: list[int], k: int) -> tuple[int | None, int | None] | None:
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
    return (outer, n) if expected == boundaries else None


def candidate_specs(structure: Structure, k: int) -> list[str]:
    """Emulator specs with the measured structure (empty when nothing was measured or the
    boundaries fit no chunk/split grid)."""
    acc = structure.accumulator
    if acc == "wider than fp32":
        return ["exact:fp64:output=fp16", "sequential:fp64:output=fp16"]
    fit = grids(structure.boundaries or [], k)
    if acc is None or structure.lanes is None or fit is None:
        return list(structure.derived)
    outer, n = fit
    # the measured product rounding first; the other is cheap to confirm or rule out
    steps = ["", ":product=fp16"] if structure.products_rounded is False else [":product=fp16", ""]
    if structure.additions_in_fp32:  # exact products, each addition rounded to fp32 then fp16
        steps = [":addition=fp32", *steps]
    output = "" if acc == "fp16" else ", output=fp16"
    specs = []
    for step in steps:
        inner = f"sequential:{acc}{step}"
        bodies = [inner] if structure.lanes == 1 else [
            f"lanes({structure.lanes}, {inner}, combine={order}:{acc})" for order in ("sequential", "pairwise")]
        for body in bodies:
            if n is not None and outer is None and structure.lanes == 1:
                model = f"chunked:{acc}:n={n}{step}:total={acc}"
            elif n is not None:
                model = f"splitk(length={n}, {body}, combine={acc})"
            else:
                model = body
            if outer is not None:
                model = f"splitk(length={outer}, {model}, combine={acc})"
            if output:
                model = model[:-1] + output + ")" if model.endswith(")") else model + ":output=fp16"
            specs.append(model)
    return specs
