"""Print the measured model of every (configuration, op) of an identify battery, by K range.

Usage: python scripts/identify_models.py [--by-op] battery.json > docs/battery-models.md
(battery.json from `convprobe identify --configs all --op all --output battery.json`;
the models are each K's own `per_k` best, with the share of outputs it matched).
`--by-op` prints one row per op and distinct model sequence, naming the configurations that
share it (on a CPU where several configurations run the same kernels, a much shorter table).
"""

import argparse
import math

from convprobe.errors import InvalidArgument
from convprobe.results import Kind, read


def _key(entry: dict) -> tuple:
    """What a K range shares: its model and match, or that it is no direct sum (no model)."""
    return (None,) if entry["best"] is None else (entry["best"], entry["fraction"])


def _in_k_order(per_k: dict) -> list[tuple[str, dict]]:
    """per_k's (K, entry) pairs by K (JSON keys are strings: '1024' sorts before '16')."""
    return sorted(per_k.items(), key=lambda item: int(item[0]))


def _share(fraction: float) -> str:
    """A match below 1 as a percentage rounded down, so that it never reads 100.0%."""
    return f"{math.floor(fraction * 1000) / 10:.1f}%"


def _ranges(per_k: dict) -> list[str]:
    """Consecutive Ks with the same model, as 'K1-K2: `model` (match)'."""
    out, run = [], []
    for k, entry in _in_k_order(per_k):
        if run and _key(entry) != _key(run[-1][1]):
            out.append(run)
            run = []
        run.append((k, entry))
    if run:
        out.append(run)
    parts = []
    for group in out:
        ks = group[0][0] if len(group) == 1 else f"{group[0][0]}–{group[-1][0]}"
        best, fraction = group[0][1]["best"], group[0][1]["fraction"]
        if best is None:  # identify found no direct sum of products there
            parts.append(f"K {ks}: not a direct sum of products")
            continue
        parts.append(f"K {ks}: `{best}`" + ("" if fraction == 1.0 else f" ({_share(fraction)})"))
    return parts


def model_rows(doc: dict, where: str) -> list[tuple[str, str, dict | None, str]]:
    """(configuration, op, per_k or None, the cell: its models K range by K range) per pair."""
    rows = []
    for config, ops in doc["matches"].items():
        for op, result in ops.items():
            name = config.split("/")[-1]
            if result.get("status") != "ok":
                rows.append((name, op, None, f"{result.get('status')}: {result.get('error')}"))
                continue
            per_k = (result.get("summary") or {}).get("per_k")
            if per_k is None:
                raise SystemExit(f"{where}: {config} {op} has no per-K models: a battery document is needed, "
                                 "not a layer map")
            rows.append((name, op, per_k, "<br>".join(_ranges(per_k))))
    return rows


def by_op(rows: list[tuple[str, str, dict | None, str]]) -> list[tuple[str, str, str]]:
    """(op, the configurations whose models agree at every K, their cell), ops in the battery's order."""
    groups: dict[str, dict[tuple, tuple[str, list[str]]]] = {}
    for config, op, per_k, cell in rows:
        same = cell if per_k is None else tuple((k, _key(e)) for k, e in _in_k_order(per_k))
        groups.setdefault(op, {}).setdefault(same, (cell, []))[1].append(config)
    return [(op, ", ".join(configs), cell) for op, cells in groups.items() for cell, configs in cells.values()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("battery", help="an identify battery document (JSON)")
    parser.add_argument("--by-op", action="store_true", help="one row per op and model, with its configurations")
    args = parser.parse_args(argv)
    try:
        doc = read(args.battery, kinds=(Kind.IDENTIFY,))
    except InvalidArgument as exc:
        parser.exit(2, f"error: {exc}\n")
    rows = model_rows(doc, args.battery)
    first = "op | configurations" if args.by_op else "configuration | op"
    print(f"| {first} | model at each K (match 100% unless shown) |")
    print("|---|---|---|")
    for row in by_op(rows) if args.by_op else [(config, op, cell) for config, op, _, cell in rows]:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
