"""A user's own Keras model under its twin and another arithmetic: writes docs/user-model-twin.md.

    python experiments/user_model_twin/run.py [--config config.json] [--output DIR] [--page docs/user-model-twin.md]

The model and data are `scripts/example_model.py`'s. For each configuration of the config:
identify measures every layer (`convprobe identify --keras-model`); `scripts/twin_your_model.py`
fits the model natively, in `use_arithmetic(model, "twin", ...)` and in
`use_arithmetic(model, COUNTERFACTUAL)`; `convprobe train --keras-model` trains it natively and
with `--arithmetic twin`. The page lists, per configuration, identify's share of ops matched at
100%, whether each twin's losses and final weights equal native training's bit for bit,
whether the counterfactual's differ, and each layer's bias placement; then the arms of
`train --arm` over two seeds. Each step runs in its own process. Not run in CI.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from convprobe import experiment, provenance

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run(argv: list[str], cwd: Path) -> str:
    """`argv` in a child process in `cwd`; its stdout (the command and its error on failure)."""
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if proc.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(argv)}\n{proc.stderr[-2000:]}")
    return proc.stdout


def convprobe(*args: str, cwd: Path) -> str:
    return run([sys.executable, "-m", "convprobe", *args], cwd)


def identified(document: dict, configuration: str) -> tuple[int, int, list[str]]:
    """(ops matched at 100% on both input sets, ops, layers identify listed as not measured)."""
    label = next(r["config"]["label"] for r in document["results"] if r["config"]["name"] == configuration)
    cells = document["matches"][label]
    perfect = sum(1 for cell in cells.values() if cell["status"] == "ok" and cell["summary"]["stops_matching_at"]
                  is None and cell["summary"]["best"] in (cell["summary"]["perfect"] or []))
    return perfect, len(cells), [item["name"] for item in document["params"].get("not_identified", [])]


def summary(directory: Path) -> dict:
    return json.loads((directory / "summary.json").read_text())["summary"]


def losses(directory: Path) -> list[str]:
    lines = (directory / "steps.csv").read_text().splitlines()
    column = lines[0].split(",").index("loss")
    return [line.split(",")[column] for line in lines[1:]]


def yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def main(argv=None) -> int:
    parser = experiment.parser(__doc__, HERE)
    parser.add_argument("--page", default=str(ROOT / "docs" / "user-model-twin.md"))
    args = parser.parse_args(argv)
    config, output = experiment.load(args)
    output.mkdir(parents=True, exist_ok=True)
    record = provenance.collect()
    run([sys.executable, str(ROOT / "scripts" / "example_model.py"), "--output", str(output)], output)
    configs = config["configs"]
    convprobe("identify", "--keras-model", "M.keras", "--configs", ",".join(configs), "--output", "map.json",
              cwd=output)
    document = json.loads((output / "map.json").read_text())
    steps, other = str(config["steps"]), config["counterfactual"]
    rows = ["| configuration | identify: ops at 100% | Python twin: losses, weights equal | "
            f"Python {other}: weights equal | CLI twin: losses, weights_sha256 equal | bias added |",
            "|---|---|---|---|---|---|"]
    for name in configs:
        perfect, total, skipped = identified(document, name)
        run([sys.executable, str(ROOT / "scripts" / "twin_your_model.py"), "M.keras", "D.npz", "map.json", "--config",
             name, "--steps", steps, "--arithmetic", other, "--json", f"{name}.json"], output)
        result = json.loads((output / f"{name}.json").read_text())
        common = ["train", "--keras-model", "M.keras", "--data", "D.npz", "--config", name, "--no-jit", "--steps",
                  steps, "--batch-size", "8", "--record-every", "1"]
        for arm, extra in (("native", []), ("twin", ["--arithmetic", "twin"])):
            convprobe(*common, *extra, "--output", f"cli_{name}_{arm}", cwd=output)
        native, twin = output / f"cli_{name}_native", output / f"cli_{name}_twin"
        biases = ", ".join(f"{layer['layer']} {layer['bias']['placement']}" for layer in
                           result["records"]["twin"]["layers"] if "bias" in layer)
        rows.append(f"| {name} | {perfect} of {total}{' (not measured: ' + ', '.join(skipped) + ')' if skipped else ''} "
                    f"| {yes(result['twin']['losses_equal'])}, {yes(result['twin']['weights_equal'])} "
                    f"| {'yes (should differ)' if result['counterfactual']['weights_equal'] else 'no: it differs'} "
                    f"| {yes(losses(native) == losses(twin))}, "
                    f"{yes(summary(native)['weights_sha256'] == summary(twin)['weights_sha256'])} | {biases} |")
        print(rows[-1], flush=True)
    arms = [arg for arm in config["arms"] for arg in ("--arm", arm)]
    table = convprobe("train", "--keras-model", "M.keras", "--data", "D.npz", *arms, "--seeds", config["seeds"],
                      "--steps", str(config["arm_steps"]), "--output", "arms", cwd=output)
    page = [
        "# Your own Keras model under its twin and under a V100's arithmetic",
        "",
        f"Generated by `python experiments/user_model_twin/run.py` ({HERE.name}/config.json); do not edit by hand.",
        "",
        *experiment.provenance_lines(record),
        "",
        "The model is `scripts/example_model.py`'s: Conv2D with a bias and ReLU, DepthwiseConv2D (depth multiplier "
        "2), SeparableConv2D, a strided Conv2DTranspose, global pooling, Dense and a float32 softmax, under "
        "`mixed_float16`, batch 8, on 64 seeded 8x8x3 images of 10 random classes (so its accuracy means nothing: "
        "the question is the arithmetic, not the task).",
        "",
        "## The twin reproduces training bit for bit; a V100's fp16 accumulation does not",
        "",
        f"Per configuration: `convprobe identify --keras-model M.keras --configs C` (every layer, its Dense as "
        f"matmuls); `python scripts/twin_your_model.py M.keras D.npz map.json --config C --steps {steps}` "
        f"(`model.fit` with a LossScaleOptimizer natively, in `use_arithmetic(model, \"twin\", arithmetic_map=...)` "
        f"and in `use_arithmetic(model, \"{other}\")`); and `convprobe train --keras-model M.keras --data D.npz "
        f"--config C --no-jit --steps {steps} --batch-size 8 --record-every 1`, natively and with `--arithmetic "
        "twin`. Bias added: where the twin measured that TensorFlow adds each biased layer's bias (after the op's "
        "fp16 result, or fused inside its kernel before the one rounding).",
        "",
        *rows,
        "",
        "## Arms over two seeds",
        "",
        f"`convprobe train --keras-model M.keras --data D.npz {' '.join(shlex.quote(a) for a in arms)} --seeds "
        f"{config['seeds']} --steps {config['arm_steps']} --output arms`:",
        "",
        "```",
        table.rstrip(),
        "```",
        "",
    ]
    return experiment.write_page(args.page, page)


if __name__ == "__main__":
    raise SystemExit(main())
