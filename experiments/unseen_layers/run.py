"""identify at layers no test uses: is every (configuration, op) cell exact, on fresh inputs too?

    python experiments/unseen_layers/run.py [--config config.json] [--output DIR]

For each layer of the config, `convprobe identify --input-shape ... --filter-shape ...` runs
in the config's configurations (as a user would type it) and writes `layer<i>.json`; then
`scripts/specs_on_fresh_inputs.py` checks every reported spec against TensorFlow on fresh
seeded confirmation inputs (signed, spread exponents, subnormals, ties, a cancelling +-M
pair per reduction). Writes `summary.md`: one row per (layer, configuration, op) with K,
the reported spec's match and its fresh-input count, the wall time of each identify run,
and the provenance of the documents (convprobe and TensorFlow versions, the CPU's
identity and caches, the commands).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from convprobe import experiment, results
from convprobe.probes.layers import Layer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def main(argv=None) -> int:
    args = experiment.parser(__doc__, HERE).parse_args(argv)
    config, output = experiment.load(args)
    rows, commands, provenance = [], [], None
    runs = [(f"layer{i}", _layer_options(layer)) for i, layer in enumerate(config.get("layers", ()))]
    runs += [(network["application"], _network_options(network, output, config["seed"]))
             for network in config.get("networks", ())]
    for name, options in runs:
        path = output / f"{name}.json"
        command = ["convprobe", "identify", "--configs", config["configurations"], "--seed", str(config["seed"]),
                   "--timeout", str(config["timeout_s"]), *options]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "convprobe", *command[1:], "--output", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        fresh = subprocess.run([sys.executable, str(ROOT / "scripts" / "specs_on_fresh_inputs.py"), str(path),
                                "--seed", str(config["fresh_seed"])], check=True, capture_output=True, text=True)
        fresh_counts = _fresh_counts(fresh.stdout)
        document = results.read(path, kinds=("identify",))
        provenance = provenance or document["provenance"]
        commands.append(" ".join([*(Path(c).name if c.endswith(".keras") else c for c in command), "--output",
                                  path.name]))
        for item in document["params"].get("not_identified", []):
            rows.append([f"`{item['name']}` ({item['kind']})", "every configuration", "-", "-",
                         f"not identified: {item['reason']}", "-", "-", f"{wall:.0f} s"])
        for label, per_op in document["matches"].items():
            for op, entry in per_op.items():
                summary = entry.get("summary") or {}
                fraction = next(iter(summary.get("fractions", {}).values()), None)
                shown = "-" if fraction is None else ("100%" if float(fraction) == 1.0 else
                                                      f"{math.floor(1000 * float(fraction)) / 10:.1f}%")
                rows.append([f"`{_label(entry['layer'])}`", label.split("/")[-1], op, str(_k(entry)),
                             entry["status"], shown, fresh_counts.get((label, op), "-"), f"{wall:.0f} s"])
    script = "python experiments/unseen_layers/run.py" + (
        "" if Path(args.config).resolve() == (HERE / "config.json") else f" --config experiments/unseen_layers/{Path(args.config).name}")
    (output / "summary.md").write_text(_page(rows, commands, provenance, config, script), encoding="utf-8")
    print(output / "summary.md")
    return 0


def _layer_options(layer: dict) -> list[str]:
    """identify's options for one layer of the config."""
    options = ["--input-shape", layer["input_shape"], "--filter-shape", layer["filter_shape"]]
    for option in ("strides", "dilation", "padding"):
        if option in layer:
            options += [f"--{option}", str(layer[option])]
    return options


def _network_options(network: dict, output: Path, seed: int) -> list[str]:
    """identify's options for a keras.applications network of the config, built with
    weights=None and the config's seed, saved as OUTPUT/NAME.keras."""
    import keras  # (only a config with networks pays for TensorFlow here)

    keras.utils.set_random_seed(seed)
    build = getattr(keras.applications, network["application"])
    model = build(weights=None, input_shape=tuple(int(v) for v in network["input_shape"].split(",")),
                  classes=int(network.get("classes", 10)))
    path = output / f"{network['application']}.keras"
    model.save(path)
    return ["--keras-model", str(path), "--batch", str(network.get("batch", 2))]


def _label(layer: dict) -> str:
    return Layer.from_dict(layer).label


def _k(entry: dict) -> int:
    return Layer.from_dict(entry["layer"]).k(entry["op"])


def _fresh_counts(table: str) -> dict:
    """{(configuration, op): 'spec of outputs'} from specs_on_fresh_inputs.py's table."""
    counts = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("tensorflow/"):
            counts[(cells[0], cells[1])] = cells[2]
    return counts


def _count(rows, value: str, column: int = 5) -> int:
    return sum(row[column] == value for row in rows)


def _page(rows, commands, provenance, config, script) -> str:
    versions = provenance["versions"]
    lines = [f"# {config.get('title', 'identify at layers no test uses')}", "",
             f"Generated by `{script}` from the identify documents it wrote; do not edit by hand.", "",
             config["description"], "",
             f"- convprobe {versions['convprobe']}, TensorFlow {versions.get('tensorflow')}, "
             f"Keras {versions.get('keras')}, NumPy {versions['numpy']}",
             f"- CPU: {provenance.get('cpu')} (identity {json.dumps(provenance.get('cpu_identity'))}, "
             f"caches {json.dumps(provenance.get('cpu_caches'))})",
             f"- seed {config['seed']}; fresh inputs: `scripts/specs_on_fresh_inputs.py --seed {config['fresh_seed']}` "
             "(confirmation inputs: signed, spread exponents, subnormals, ties, a cancelling +-M pair per reduction)",
             "", f"**{_count(rows, '100%')} of {len(rows)} (layer, configuration, op) cells match 100% on both "
             f"input sets**; {_count(rows, 'unsupported', column=4)} are ops TensorFlow refuses on this CPU "
             "(a dilated or grouped conv2d's gradients; the table gives TensorFlow's error); the rest read \"none matches; closest ...\" in identify's table.", "",
             "Commands:", "", "```", *commands, "```", "",
             "A match below 100% is rounded down, so it never reads 100%. Wall times are of this run, on a shared "
             "machine.", "",
             "| layer | configuration | op | K | status | match | fresh inputs (spec bitwise equal) | identify wall |",
             "|---|---|---|---|---|---|---|---|",
             *("| " + " | ".join(row) + " |" for row in rows), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
