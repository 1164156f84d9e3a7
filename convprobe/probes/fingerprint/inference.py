"""From the battery's outputs to properties (parent side), and the one-line verdict."""

from __future__ import annotations

import math

import numpy as np

from convprobe.probes.fingerprint.battery import (ALIGNED_X, C_BITS, COPIES, D_BITS, DISTANCES, F16MAX, MAX_J,
                                                  ORDERINGS, PROPERTIES, ROUNDING_P, battery)

__all__ = ["infer", "infer_observed", "interpret", "fingerprint_backend"]


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
    from convprobe.probes.fingerprint.execution import run_battery

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
