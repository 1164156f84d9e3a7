"""`sweep`: error versus reduction length K and input distribution, as a tidy table.

For each op, distribution and K (9 * 2**i, 9 ... 18432: C_in * 3 * 3 for
C_in = 1 ... 2048), M seeded rows of K fp16 products are reduced by the
backend (`fingerprint_ops.reduce_rows`) and compared with the exact result
(fp16 products are exact in float64 and their sum has relative error at most
K * 2**-53, far below anything measured in fp16). Metrics come from
`convprobe.analysis.metrics.summarize`; the bounds and the
`exceeds_probabilistic` flag from `convprobe.analysis.tables.add_bounds`.

`stagnated` (the running sum stopped growing): only for distributions whose
products are all >= 0; true when every row's result falls *below* the exact
sum by more than the probabilistic fp16 bound lambda sqrt(K) u16 sum|x w|
(Higham & Mary 2019) - random rounding errors scatter on both sides, while
terms smaller than half an ulp of the running sum are lost one-sidedly
(Higham 2002, sec. 4.2: recursive summation of positive terms).
"""

from __future__ import annotations

import numpy as np

from convprobe.errors import InvalidArgument, UnsupportedConfiguration
from convprobe.formats import FP16
from convprobe.options import Distribution, names_or_all
from convprobe.probes.fingerprint_ops import QUADRATIC_LIMIT, QUADRATIC_OPS, check_ops, reduce_rows
from convprobe.provenance import memory_limit
from convprobe.render import json_clean

__all__ = ["CHANNELS", "DISTRIBUTIONS", "DISTRIBUTION_SEEDS", "DEFAULT_KS", "DEFAULT_ROWS", "check_distributions", "check_size",
           "memory_estimate", "inputs", "run", "records", "interpret"]

DISTRIBUTIONS = tuple(Distribution)
#: Each distribution's seed stream, keyed by name: adding one changes no other's rows.
DISTRIBUTION_SEEDS: dict[str, int] = {Distribution.UNIFORM01: 0, Distribution.UNIFORM11: 1, Distribution.NORMAL: 2,
                      Distribution.HEAVY_TAILED: 3}
DEFAULT_KS = tuple(9 * 2**i for i in range(12))  # 9 ... 18432
DEFAULT_ROWS = 32
HEAVY_CLIP = 64.0  # |x| <= 64 keeps every product (<= 4096) and most sums inside fp16


def check_distributions(names) -> tuple[str, ...]:
    """Validate distribution names (a comma list, a list, or 'all')."""
    return names_or_all(names, DISTRIBUTIONS, "distribution")


#: Filters per call; row m reads filter m % CHANNELS (as in `identify`: TensorFlow picks other
#: kernels for a single filter, a matrix-vector product, than for several).
CHANNELS = 2


def inputs(distribution: str, seed: int, k: int, rows: int = DEFAULT_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Seeded fp16 rows (rows x k) and CHANNELS filters (CHANNELS x k) drawn from `distribution`.

    uniform01: U[0, 1); uniform11: U[-1, 1); normal: N(0, 1); heavy_tailed:
    Student t with 2 degrees of freedom, clipped to [-64, 64].
    """
    rng = np.random.default_rng([seed, k, DISTRIBUTION_SEEDS[check_distributions([distribution])[0]]])

    def draw(shape):
        if distribution == "uniform01":
            return rng.uniform(0.0, 1.0, shape)
        if distribution == "uniform11":
            return rng.uniform(-1.0, 1.0, shape)
        if distribution == "normal":
            return rng.standard_normal(shape)
        return np.clip(rng.standard_t(2.0, shape), -HEAVY_CLIP, HEAVY_CLIP)

    return draw((rows, k)).astype(np.float16), draw((CHANNELS, k)).astype(np.float16)


def _measure(y: np.ndarray, a: np.ndarray, b: np.ndarray, k: int) -> tuple[dict, list[float]]:
    from convprobe.analysis import probabilistic_bound, summarize, ulp_error
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)[np.arange(a.shape[0]) % b.shape[0]]  # each row's filter
    exact = np.einsum("mk,mk->m", a64, b64)
    abs_sum = np.einsum("mk,mk->m", np.abs(a64), np.abs(b64))
    with np.errstate(over="ignore", invalid="ignore"):
        metrics = summarize(y, exact, "fp16", abs_sum=abs_sum)
        ulps = ulp_error(y, exact, FP16)
    nonnegative = bool(np.all(a64 >= 0) and np.all(b64 >= 0))
    if nonnegative:
        threshold = probabilistic_bound(k, FP16.unit_roundoff) * abs_sum
        metrics["stagnated"] = bool(np.all(y.astype(np.float64) < exact - threshold))
    else:
        metrics["stagnated"] = None
    return metrics, [float(u) for u in np.asarray(ulps, dtype=np.float64).ravel()]


def memory_estimate(rows: int, k: int) -> int:
    """Bytes one point holds at once, roughly: the fp16 rows, and the float64 copies of rows and
    filters, their magnitudes and products that `_measure` forms (rows x K each)."""
    return rows * k * (2 + 5 * 8)


def check_size(rows: int, ks) -> None:
    """Refuse, before anything runs, rows x K that would not fit in `provenance.memory_limit()`
    (half this machine's memory) in one configuration's process."""
    need, limit = memory_estimate(rows, max(ks)), memory_limit()
    if need > limit:
        raise InvalidArgument(f"--rows {rows} at K = {max(ks)} needs about {need / 2**30:.1f} GiB; at most "
                              f"{limit / 2**30:.1f} GiB (half this machine's memory) is allowed: use fewer rows "
                              f"or a smaller K")


def run(backend, *, ops="conv2d", ks=DEFAULT_KS, distributions=DISTRIBUTIONS, rows: int = DEFAULT_ROWS,
        seed: int = 0, **_params) -> dict:
    """Child side: metrics per op x distribution x K, and the ULP errors at the largest K."""
    results = {}
    for op in check_ops(ops):
        try:
            points, ulps = [], {}
            for dist in check_distributions(distributions):
                for k in ks:
                    if op in QUADRATIC_OPS and k > QUADRATIC_LIMIT:
                        continue
                    a, b = inputs(dist, seed, k, rows)
                    channel = np.arange(rows) % CHANNELS
                    y = np.asarray(reduce_rows(backend, op, a, b, channel)).astype(np.float16)
                    metrics, ulp_list = _measure(y, a, b, k)
                    points.append({"distribution": dist, "k": int(k), **{m: json_clean(v) for m, v in metrics.items()}})
                    ulps[dist] = {"k": int(k), "ulp_errors": [json_clean(u) for u in ulp_list]}
            results[op] = {"status": "ok", "points": points, "ulp_errors_at_largest_k": ulps}
        except UnsupportedConfiguration as exc:
            results[op] = {"status": "unsupported", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one failing op must not hide the others
            results[op] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"ops": results, "rows": rows, "seed": seed}


def _unjson(value):
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def records(result, seed: int) -> list[dict]:
    """SWEEP_SCHEMA records (without bounds) for one `ProbeResult` of this probe; non-ok rows kept."""
    identity = result.identity()
    out = []
    ops = result.observed.get("ops", {}) if result.status == "ok" else {}
    if not ops:
        out.append({**identity, "op": "-", "format": "fp16", "distribution": "-", "k": 0, "seed": seed,
                    "status": result.status, "detail": result.error})
        return out
    for op, op_result in ops.items():
        if op_result.get("status") != "ok":
            out.append({**identity, "op": op, "format": "fp16", "distribution": "-", "k": 0, "seed": seed,
                        "status": op_result.get("status", "failed"), "detail": op_result.get("error")})
            continue
        for point in op_result["points"]:
            row = {key: _unjson(v) for key, v in point.items()}
            out.append({**identity, "op": op, "seed": seed, "status": "ok", "detail": None, **row})
    return out


def interpret(observed: dict) -> dict:
    worst = []
    for op, result in observed.get("ops", {}).items():
        if result.get("status") == "ok":
            stagnated = sorted({p["k"] for p in result["points"] if p.get("stagnated")})
            worst.append(f"{op}: stagnates from K={stagnated[0]}" if stagnated else f"{op}: no stagnation")
    return {"accumulation": "unknown", "arithmetic": "; ".join(worst), "verdict": "; ".join(worst),
            "evidence": "error versus K per distribution (see the sweep table)"}
