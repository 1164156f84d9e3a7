"""Print the measured model of every (configuration, op) of an identify battery, by K range.

Usage: python scripts/identify_models.py battery.json > docs/battery-models.md
(battery.json from `convprobe identify --configs all --op all --output battery.json`;
the models are each K's own `per_k` best, with the share of outputs it matched).
"""

import json
import sys


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


def main(path: str) -> None:
    with open(path) as handle:
        doc = json.load(handle)
    print("| configuration | op | model at each K (match 100% unless shown) |")
    print("|---|---|---|")
    for config, ops in doc["matches"].items():
        for op, result in ops.items():
            if result.get("status") != "ok":
                print(f"| {config.split('/')[-1]} | {op} | {result.get('status')}: {result.get('error')} |")
                continue
            per_k = result["summary"].get("per_k")
            if per_k is None:
                raise SystemExit(f"{path}: {config} {op} has no per-K models: a battery document is needed, "
                                 "not a layer map")
            print(f"| {config.split('/')[-1]} | {op} | {'<br>'.join(_ranges(per_k))} |")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    main(sys.argv[1])
