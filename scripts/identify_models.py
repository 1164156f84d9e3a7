"""Print the measured model of every (configuration, op) of an identify battery, by K range.

Usage: python scripts/identify_models.py [--by-op] battery.json > docs/battery-models.md
(battery.json from `convprobe identify --configs all --op all --output battery.json`;
the models are each K's own `per_k` best, with the share of outputs it matched).
`--by-op` prints one row per op and distinct model, naming the configurations that share it
(on a CPU where several configurations run the same kernels, a table a tenth as long).
"""

import sys

from convprobe.errors import InvalidArgument
from convprobe.results import Kind, read


def _key(entry: dict) -> tuple:
    """What a K range shares: its model and match, or that it is no direct sum (no model)."""
    return (None,) if entry["best"] is None else (entry["best"], entry["fraction"])


def _ranges(per_k: dict) -> list[str]:
    """Consecutive Ks with the same model, as 'K1-K2: `model` (match)'."""
    out, run = [], []
    for k, entry in sorted(per_k.items(), key=lambda item: int(item[0])):
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
        parts.append(f"K {ks}: `{best}`" + ("" if fraction == 1.0 else f" ({fraction:.1%})"))
    return parts


def model_cells(doc: dict, where: str) -> list[tuple[str, str, str]]:
    """(configuration, op, the op's models K range by K range) for every pair of the battery."""
    rows = []
    for config, ops in doc["matches"].items():
        for op, result in ops.items():
            name = config.split("/")[-1]
            if result.get("status") != "ok":
                rows.append((name, op, f"{result.get('status')}: {result.get('error')}"))
                continue
            per_k = result["summary"].get("per_k")
            if per_k is None:
                raise SystemExit(f"{where}: {config} {op} has no per-K models: a battery document is needed, "
                                 "not a layer map")
            rows.append((name, op, "<br>".join(_ranges(per_k))))
    return rows


def by_op(rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """(op, the configurations that share a model sequence, that sequence), ops in battery order."""
    groups: dict[str, dict[str, list[str]]] = {}
    for config, op, cell in rows:
        groups.setdefault(op, {}).setdefault(cell, []).append(config)
    return [(op, ", ".join(configs), cell) for op, cells in groups.items() for cell, configs in cells.items()]


def main(argv: list[str]) -> None:
    grouped = argv[:1] == ["--by-op"]
    paths = argv[1:] if grouped else argv
    if len(paths) != 1 or paths[0].startswith("-"):
        raise SystemExit(__doc__)
    try:
        doc = read(paths[0], kinds=(Kind.IDENTIFY,))
    except InvalidArgument as exc:
        raise SystemExit(f"error: {exc}") from None
    rows = model_cells(doc, paths[0])
    if grouped:
        print("| op | configurations | model at each K (match 100% unless shown) |")
        print("|---|---|---|")
        rows = by_op(rows)
    else:
        print("| configuration | op | model at each K (match 100% unless shown) |")
        print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
