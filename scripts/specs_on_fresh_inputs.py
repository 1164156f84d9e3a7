"""Do a layer map's measured specs reproduce the framework on inputs identify never saw?

For every (configuration, layer, op) of an identify document in layer mode (`--input-shape`,
`--resnet-size` or `--keras-model`) with a best spec, the framework (TensorFlow, JAX or
PyTorch) computes the op on fresh seeded inputs in a child process with that
configuration's switches, and
`convprobe.emulation` computes it under the spec. Prints the bitwise-equal outputs of each,
and those of `sequential:fp16:product=fp16` beside them as the plain baseline. Each child
runs the configuration the document recorded (its environment, threads and --env
included). The inputs are, by default, those on which a wrong model can fail
(`layers.op_confirmation_inputs`: signed, exponents spread, subnormals, ties) at another
seed; `--inputs uniform` draws U[0, 1) operands as identify's first set (`layers.op_inputs`):

    python scripts/specs_on_fresh_inputs.py map.json [--seed 12345] [--inputs varied|uniform]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from convprobe import results
from convprobe.backends import EmulatedBackend
from convprobe.backends.configurations import BackendConfig, FrameworkConfig
from convprobe.backends.isolation import child_environment
from convprobe.probes.layers import Layer, op_confirmation_inputs, op_inputs, run_op

PLAIN = "sequential:fp16:product=fp16"
INPUTS = {"varied": op_confirmation_inputs, "uniform": op_inputs}

CHILD = """
import json, sys
import numpy as np
from convprobe.backends.configurations import BackendConfig
from convprobe.probes.layers import Layer, op_confirmation_inputs, op_inputs, run_op
from convprobe.probes.worker import make_backend
request = json.load(open(sys.argv[1]))
backend = make_backend(BackendConfig.from_dict(request["config"]))
draw = op_inputs if request["inputs"] == "uniform" else op_confirmation_inputs
outputs = {}
for i, (layer, op) in enumerate(request["cases"]):
    layer = Layer.from_dict(layer)
    outputs[str(i)] = run_op(backend, layer, op, *draw(layer, op, request["seed"]))
np.savez(sys.argv[2], **outputs)
"""


def _equal(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.count_nonzero(a.view(np.uint16) == b.view(np.uint16)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    parser.add_argument("--seed", type=int, default=12345, help="fresh inputs' seed (identify's default is 0)")
    parser.add_argument("--inputs", choices=INPUTS, default="varied",
                        help="varied: signed, spread exponents, subnormals, ties (default); uniform: U[0, 1)")
    args = parser.parse_args()
    document = results.read(args.document, kinds=("identify",))
    configs = {r["config"]["label"]: BackendConfig.from_dict(r["config"]) for r in document["results"]}
    table, skipped = [], []
    for label, entries in document["matches"].items():
        cases = [(key, e) for key, e in entries.items() if "layer" in e and (e.get("summary") or {}).get("best")]
        skipped += [f"{label} {key}" for key, e in entries.items() if (key, e) not in cases]
        config = configs[label]
        if cases and isinstance(config, FrameworkConfig):
            table += _compare(config, cases, args.seed, args.inputs)
        elif cases:
            skipped += [f"{label} {key} (the emulator: nothing to compare)" for key, _ in cases]
    if not table:
        sys.exit(f"{args.document}: no framework's layer with a best spec to compare (a layer map from "
                 "`convprobe identify --input-shape`, `--resnet-size` or `--keras-model` is needed)")
    print(f"inputs: {args.inputs}, seed {args.seed}")
    print("| configuration | layer / op | spec | plain |\n|---|---|---|---|")
    print("\n".join(table))
    if skipped:
        print(f"not compared (no layer or no best spec): {', '.join(skipped)}")


def _compare(config: FrameworkConfig, cases: list, seed: int, inputs: str) -> list[str]:
    """One table row per case: the framework (TensorFlow, JAX, PyTorch) in a child with the
    configuration's switches, the emulator here."""
    with tempfile.TemporaryDirectory() as folder:
        request, answer = Path(folder) / "request.json", Path(folder) / "answer.npz"
        request.write_text(json.dumps({"config": config.to_dict(), "seed": seed, "inputs": inputs,
                                       "cases": [(e["layer"], e["op"]) for _, e in cases]}))
        proc = subprocess.run([sys.executable, "-c", CHILD, str(request), str(answer)],
                              env=child_environment(config), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{config.label}: the framework's child failed:\n{proc.stderr[-4000:]}")
        observed = np.load(answer)
        rows = []
        for i, (key, entry) in enumerate(cases):
            layer, op = Layer.from_dict(entry["layer"]), entry["op"]
            first, second = INPUTS[inputs](layer, op, seed)
            y = observed[str(i)]
            spec = _equal(run_op(EmulatedBackend(entry["summary"]["best"]), layer, op, first, second), y)
            plain = _equal(run_op(EmulatedBackend(PLAIN), layer, op, first, second), y)
            rows.append(f"| {config.label} | {key} | {spec} of {y.size} | {plain} of {y.size} |")
        return rows

if __name__ == "__main__":
    main()
