"""Do a layer map's measured specs reproduce TensorFlow on inputs identify never saw?

For every (configuration, layer, op) of an identify document in layer mode (`--input-shape`,
`--resnet-size` or `--keras-model`) with a best spec, TensorFlow computes the op on fresh
seeded inputs in a child process with that configuration's environment, and
`convprobe.emulation` computes it under the spec. Prints the bitwise-equal outputs of each,
and those of `sequential:fp16:product=fp16` beside them as the plain baseline:

    python scripts/specs_on_fresh_inputs.py map.json [--seed 12345]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from convprobe.backends import EmulatedBackend
from convprobe.backends.configurations import matrix_configs
from convprobe.probes.layers import Layer, op_inputs, run_op

PLAIN = "sequential:fp16:product=fp16"

CHILD = """
import json, sys
import numpy as np
from convprobe.backends.configurations import BackendConfig
from convprobe.probes.layers import Layer, op_inputs, run_op
from convprobe.worker import make_backend
request = json.load(open(sys.argv[1]))
backend = make_backend(BackendConfig.from_dict(request["config"]))
outputs = {}
for i, (layer, op) in enumerate(request["cases"]):
    layer = Layer.from_dict(layer)
    outputs[str(i)] = run_op(backend, layer, op, *op_inputs(layer, op, request["seed"]))
np.savez(sys.argv[2], **outputs)
"""


def _equal(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.count_nonzero(a.view(np.uint16) == b.view(np.uint16)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    parser.add_argument("--seed", type=int, default=12345, help="fresh inputs' seed (identify's default is 0)")
    args = parser.parse_args()
    matches = json.loads(Path(args.document).read_text())["matches"]
    configs = {c.label: c for c in matrix_configs("cpu", "all")}
    print("| configuration | layer / op | spec | plain |\n|---|---|---|---|")
    for label, entries in matches.items():
        cases = [(key, e) for key, e in entries.items() if "layer" in e and (e.get("summary") or {}).get("best")]
        if label not in configs or not cases:
            continue
        with tempfile.TemporaryDirectory() as folder:
            request, answer = Path(folder) / "request.json", Path(folder) / "answer.npz"
            request.write_text(json.dumps({"config": configs[label].to_dict(), "seed": args.seed,
                                           "cases": [(e["layer"], e["op"]) for _, e in cases]}))
            subprocess.run([sys.executable, "-c", CHILD, str(request), str(answer)], check=True,
                           env={**os.environ, **configs[label].env}, capture_output=True)
            observed = np.load(answer)
            for i, (key, entry) in enumerate(cases):
                layer, op = Layer.from_dict(entry["layer"]), entry["op"]
                first, second = op_inputs(layer, op, args.seed)
                y = observed[str(i)]
                spec = _equal(run_op(EmulatedBackend(entry["summary"]["best"]), layer, op, first, second), y)
                plain = _equal(run_op(EmulatedBackend(PLAIN), layer, op, first, second), y)
                print(f"| {label} | {key} | {spec} of {y.size} | {plain} of {y.size} |")


if __name__ == "__main__":
    main()
