"""`identify`: which emulator model reproduces a backend's op bit for bit?

The backend runs each op on seeded random fp16 inputs (M dot products of
length K, embedded as in `fingerprint_ops`) for K = 16 ... 8192, and conv2d and
conv2d_spatial up to 16384 (`default_ks`); the parent
recomputes the same dot products under every candidate model of the emulator
and counts, per K, the fraction of outputs that are bitwise identical. The
best model is the one with the most matches over all K (ties go to the
simpler model, listed first); the first K at which it stops matching exposes
blocking or reordering the model does not capture (e.g. a kernel that is
sequential up to its register block and then combines partial sums).

Besides the emulator's own models (`convprobe.emulation.parse_model` specs),
the family includes *lane* models, ``lanes:FMT:w=W:then=ORDER``: the K terms
are dealt round-robin to W accumulators (k mod W), each summed sequentially
in FMT, and the W lane sums are then combined sequentially or pairwise - what
a SIMD reduction over the contracted axis does (`convprobe.emulation.Lanes`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from convprobe.emulation import AccumulationModel, dot, parse_model
from convprobe.errors import InvalidArgument, UnsupportedConfiguration
from convprobe.probes.encoding import encode_bits
from convprobe.probes.fingerprint_ops import QUADRATIC_LIMIT, QUADRATIC_OPS, check_ops, reduce_many, reduce_rows
from convprobe.identify.candidates import candidate_specs
from convprobe.identify.structure import Structure, best_of, bitwise_equal, blocks, measure_rows
from convprobe.render import share_text

__all__ = [
    "DEFAULT_KS",
    "LONG_KS",
    "default_ks",
    "battery_ks",
    "ks_for",
    "DEFAULT_ROWS",
    "DEFAULT_CANDIDATES",
    "Candidate",
    "parse_candidate",
    "candidates",
    "inputs",
    "channels",
    "CHANNELS",
    "run",
    "match_fractions",
    "summarize_matches",
    "interpret",
    "identify_backend",
]

DEFAULT_KS = tuple(2**i for i in range(4, 14))  # 16 ... 8192
#: conv2d is also asked for at K = 16384 (a 1x1 layer of 16384 channels, a 3x3 of about 1820):
#: deep layers reach it, and an answer must hold there too.
LONG_KS = {"conv2d": (16384,), "conv2d_spatial": (16384,)}
DEFAULT_ROWS = 64

#: The model family searched by default: simplest first (ties go to the earlier one).
DEFAULT_CANDIDATES = (
    "exact:fp64:output=fp16",
    "sequential:fp32:output=fp16",
    "sequential:fp16",
    "sequential:fp16:product=fp16",
    "sequential:fp16:addition=fp32",
    "sequential:fp32:product=fp16:output=fp16",
    "pairwise:fp32:output=fp16",
    "pairwise:fp16",
    *(f"chunked:fp16:n={n}" for n in (8, 16, 32, 64, 128, 256)),
    *(f"chunked:fp16:n={n}:addition=fp32:total={t}" for n in (256, 512, 1024, 2048) for t in ("fp32", "fp16")),
    *(f"blocked:fp16:b={b}" for b in (2, 4, 8, 16, 32)),
    *(f"blocked:fp16:b={b}:rounding=nearest_even" for b in (2, 4, 8, 16, 32)),
    *(f"blocked:fp32:b={b}:extra={e}:output=fp16" for b in (4, 8, 16) for e in (0, 3)),
    *(f"lanes:fp32:w={w}:then={t}" for w in (4, 8, 16, 32) for t in ("sequential", "pairwise")),
    *(f"lanes:fp16:w={w}:then={t}" for w in (4, 8, 16, 32) for t in ("sequential", "pairwise")),
    *(f"lanes:fp16:w={w}:then={t}:product=fp16" for w in (8, 16, 32) for t in ("sequential", "pairwise")),
)


@dataclass(frozen=True)
class Candidate:
    """A named way of reducing rows of products; `compute(a, b)` -> fp16 outputs."""

    name: str
    model: AccumulationModel | None = None

    def compute(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Row m of `a` against filter b[m % len(b)] (b may be one filter (k,) or several (c, k))."""
        b = np.atleast_2d(b)
        b = b[np.arange(a.shape[0]) % b.shape[0]]
        assert self.model is not None  # candidates are built by parse_candidate, always with a model
        return np.asarray(dot(a, b, self.model)).astype(np.float16)


def parse_candidate(spec: str) -> Candidate:
    """A candidate from any `convprobe.emulation.parse_model` spec (lane models included)."""
    text = spec.strip()
    return Candidate(text, model=parse_model(text))


def candidates(specs=None) -> list[Candidate]:
    """Parse candidate specs (None = `DEFAULT_CANDIDATES`); bad specs fail before anything runs."""
    return [parse_candidate(s) for s in (specs or DEFAULT_CANDIDATES)]


#: Output channels (filters) of each call: real convolutions have many, and TensorFlow picks
#: different kernels for one filter (a matrix-vector product) than for several.
CHANNELS = 2


def inputs(seed: int, k: int, rows: int = DEFAULT_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Seeded fp16 rows (rows, k) and CHANNELS filters (CHANNELS, k); row m reads filter m % CHANNELS.

    Filters ~ U[0, 1) with b[:, 0] = b[:, k-1] = 1. A third of the rows are
    U[0, 1) (growing sums: separate fp16 models), a third U[-1, 1), and a third
    *offset* rows: U[0, 1) terms between +c and -c, c = 2**15 * U[1, 1.5). The
    offset makes every fp32 partial sum round at ulp 2**-8, so the order of fp32
    additions shows in the fp16 result (plain random rows are correctly rounded
    by every fp32 model).
    """
    rng = np.random.default_rng([seed, k])
    third = rows // 3
    a = np.concatenate([
        rng.uniform(0.0, 1.0, (rows - 2 * third, k)),
        rng.uniform(-1.0, 1.0, (third, k)),
        rng.uniform(0.0, 1.0, (third, k)),
    ]).astype(np.float16)
    b = rng.uniform(0.0, 1.0, (CHANNELS, k)).astype(np.float16)
    if k >= 2:
        offset = (2.0**15 * rng.uniform(1.0, 1.5, third)).astype(np.float16)
        a[rows - third:, 0] = offset
        a[rows - third:, k - 1] = -offset
        b[:, 0] = b[:, k - 1] = 1.0
    return a, b


def channels(rows: int) -> np.ndarray:
    """The filter each row reads."""
    return np.arange(rows) % CHANNELS


def default_ks(op: str) -> tuple[int, ...]:
    """The Ks `op` is identified at when none are asked for: 16 ... 8192, plus `LONG_KS`."""
    return DEFAULT_KS + LONG_KS.get(op, ())


def ks_for(op: str, ks) -> list[int]:
    """`ks`, or `op`'s default Ks where it is None, less those an op quadratic in K skips."""
    return [k for k in (default_ks(op) if ks is None else ks) if not (op in QUADRATIC_OPS and k > QUADRATIC_LIMIT)]


def battery_ks(ops, ks=None) -> list[int]:
    """Every K at which some op of `ops` is identified (`ks`, or each op's default)."""
    return sorted({k for op in ops for k in ks_for(op, ks)})


def run(backend, *, ops="conv2d", ks=None, rows: int = DEFAULT_ROWS, seed: int = 0, layers=None,
        measure: bool = True, **_params) -> dict:
    """Child side: each op's outputs (fp16 bit patterns) on the seeded inputs for every K, and
    (`measure`) its structure from crafted rows. The layer mode (`layers`) is a probe of its
    own, `convprobe.identify.layer_identify`, which `convprobe identify` runs by module path."""
    if layers is not None:
        raise InvalidArgument("the identify battery takes no layers: the layer mode is the probe "
                              "convprobe.identify.layer_identify")

    from convprobe.identify import direct_sum
    results = {}
    for op in check_ops(ops):
        try:
            per_k, structures, directs = {}, {}, {}
            for k in ks_for(op, ks):
                a, b = inputs(seed, k, rows)
                y = np.asarray(reduce_rows(backend, op, a, b, channels(rows))).astype(np.float16)
                per_k[str(k)] = encode_bits(y)
                directs[str(k)] = direct_sum.safely(direct_sum.probe_rows, backend, op, k, channels(rows), seed).to_dict()
                if measure:
                    structures[str(k)] = measure_rows(_crafted_rows(backend, op, k, rows), k).to_dict()
            results[op] = {"status": "ok", "bits": per_k, "structures": structures, "direct": directs}
        except UnsupportedConfiguration as exc:
            results[op] = {"status": "unsupported", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one failing op must not hide the others
            results[op] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"ops": results, "rows": rows, "seed": seed, "ks": list(ks) if ks is not None else battery_ks(results)}


def _crafted_rows(backend, op: str, k: int, rows: int):
    """`structure.measure_rows`'s runner at the battery's own shape: the crafted terms go in
    the rows (`rows` per call), every filter is the constant."""
    def run(patterns: np.ndarray, scale: float) -> np.ndarray:
        b = np.full((CHANNELS, k), scale, dtype=np.float16)
        sums = reduce_many(backend, op, [(a, b, channels(rows)) for a in blocks(patterns, rows, scale)])
        return np.concatenate([np.asarray(s, dtype=np.float64) for s in sums])[:len(patterns)]

    return run


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values.astype(np.float16)).view(np.uint16)


_PREDICTIONS: dict[tuple, np.ndarray | None] = {}
_PREDICTIONS_LOCK = threading.Lock()


def predicted_bits(cand: Candidate, *, seed: int, k: int, rows: int) -> np.ndarray | None:
    """The fp16 bit patterns of a candidate on the seeded inputs; cached, since every
    configuration and op is compared with the same predictions. None if the candidate cannot run."""
    key = (cand.name, seed, k, rows)
    with _PREDICTIONS_LOCK:
        if key not in _PREDICTIONS:
            a, b = inputs(seed, k, rows)
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    predicted = cand.compute(a, b)
                _PREDICTIONS[key] = _bits(predicted)
            except InvalidArgument:
                _PREDICTIONS[key] = None
        return _PREDICTIONS[key]


def match_fractions(bits_by_k: dict[str, list[str]], cands: list[Candidate], *, rows: int, seed: int) -> dict[str, dict[int, float]]:
    """{candidate name: {K: fraction of outputs bitwise equal}} (NaNs match NaNs of any payload)."""
    table: dict[str, dict[int, float]] = {c.name: {} for c in cands}
    for key, hexes in bits_by_k.items():
        k = int(key)
        observed = np.array([int(h, 16) for h in hexes], dtype=np.uint16)
        for cand in cands:
            prediction = predicted_bits(cand, seed=seed, k=k, rows=rows)
            if prediction is not None:
                table[cand.name][k] = float(np.mean(bitwise_equal(prediction, observed)))
    return table


def summarize_matches(table: dict[str, dict[int, float]]) -> dict:
    """Best model (most matches over all K, earliest on ties), its fractions, where it stops matching."""
    scored = [(sum(fr.values()), -i, name) for i, (name, fr) in enumerate(table.items()) if fr]
    if not scored:
        return {"best": None, "fractions": {}, "stops_matching_at": None, "perfect": []}
    _, _, best = max(scored)
    fractions = dict(sorted(table[best].items()))
    stops = next((k for k, f in fractions.items() if f < 1.0), None)
    perfect = [name for name, fr in table.items() if fr and all(f == 1.0 for f in fr.values())]
    return {"best": best, "fractions": fractions, "stops_matching_at": stops, "perfect": perfect}


def identify_observed(observed: dict, specs=None) -> dict[str, dict]:
    """{op: {"status", "error", "table", "summary"}} from `run`'s observations. A K at which
    the op is not a direct sum of products (`direct_sum.probe_rows`) keeps its table column
    (the closest models) but gets no model: the summary's best is chosen over the other Ks,
    `not_direct_at` lists it and `direct_per_k` holds each K's evidence."""
    cands = candidates(specs)
    per_op = {}
    for op, result in observed.get("ops", {}).items():
        if result.get("status") != "ok":
            per_op[op] = {"status": result.get("status", "failed"), "error": result.get("error"), "table": {}, "summary": {}}
            continue
        table = match_fractions(result["bits"], cands, rows=observed["rows"], seed=observed["seed"])
        direct = result.get("direct") or {}  # older documents lack it
        not_direct = sorted(int(k) for k, d in direct.items() if d["direct"] is False)
        summary = summarize_matches({name: {k: f for k, f in fr.items() if k not in not_direct}
                                     for name, fr in table.items()})
        summary["direct_per_k"] = {int(k): d for k, d in direct.items()}
        summary["not_direct_at"] = not_direct
        summary["per_k"] = best_per_k(result, table, rows=observed["rows"], seed=observed["seed"])
        for k in not_direct:  # say so rather than force a model
            if k in summary["per_k"]:
                summary["per_k"][k] = {**summary["per_k"][k], "best": None, "closest": summary["per_k"][k]["best"]}
        per_op[op] = {"status": "ok", "error": None, "table": table, "summary": summary}
    return per_op


def _parseable(specs) -> list[Candidate]:
    """Candidates of the specs the emulator accepts (a measured structure it cannot express
    is simply not a candidate)."""
    out = []
    for spec in specs:
        try:
            out.append(parse_candidate(spec))
        except InvalidArgument:
            continue
    return out


def best_per_k(result: dict, table: dict[str, dict[int, float]], *, rows: int, seed: int) -> dict[int, dict]:
    """{K: {"best", "fraction", "measured", "structure"}}: at each K, the specs the crafted
    inputs measured there (`candidates.candidate_specs`), then the family; ties go to the
    measured spec. The arithmetic changes with K (blocking, threads), so each K has its own."""
    out = {}
    for key, hexes in result["bits"].items():
        k = int(key)
        structure = result.get("structures", {}).get(key)
        measured = candidate_specs(Structure(**structure), k) if structure else []
        scores = {spec: fr[k] for spec, fr in match_fractions(
            {key: hexes}, _parseable(measured), rows=rows, seed=seed).items() if k in fr}
        for name, fractions in table.items():
            if k in fractions:
                scores.setdefault(name, fractions[k])
        if scores:
            best = best_of(scores)
            out[k] = {"best": best, "fraction": scores[best], "measured": measured, "structure": structure}
    return dict(sorted(out.items()))


def _describe(summary: dict) -> str:
    not_direct = summary.get("not_direct_at") or []
    transform = (f"not a direct sum of products at K={', '.join(map(str, not_direct))}" if not_direct else "")
    if not summary.get("best"):
        return transform or "no candidate could be evaluated"
    fr = ", ".join(f"K={k}: {share_text(f)}" for k, f in summary["fractions"].items())
    stop = summary["stops_matching_at"]
    tail = "matches at every K" if stop is None else f"stops matching at K={stop}"
    return f"{summary['best']} ({tail}{' of the others' if not_direct else ''}; {fr})" + (f"; {transform}" if transform else "")


def interpret(observed: dict) -> dict:
    per_op = identify_observed(observed)
    verdicts = {op: (_describe(r["summary"]) if r["status"] == "ok" else r["status"]) for op, r in per_op.items()}
    best = {r["summary"].get("best") for r in per_op.values() if r["status"] == "ok"}
    accumulation = "unknown"
    if best and None not in best:
        fp16 = all(":fp16" in b for b in best)
        wide = all(":fp16" not in b.split(":output")[0] for b in best)
        accumulation = "fp16" if fp16 else "fp32" if wide else "mixed"
    return {
        "accumulation": accumulation,
        "arithmetic": "; ".join(f"{op}: {r['summary'].get('best')}" for op, r in per_op.items() if r["status"] == "ok"),
        "verdict": "; ".join(f"{op}: {v}" for op, v in verdicts.items()),
        "evidence": "bitwise match fraction per K against every candidate model",
    }


def identify_backend(backend, op: str = "matmul", *, ks=None, rows: int = DEFAULT_ROWS, seed: int = 0, specs=None,
                     measure: bool = True) -> dict:
    """In-process identify of one op (the self-check on the emulator): the summary dict and table;
    `measure=False` searches the family alone."""
    observed = run(backend, ops=[op], ks=ks, rows=rows, seed=seed, measure=measure)
    return identify_observed(observed, specs)[op]
