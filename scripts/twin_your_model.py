"""Your own Keras model fitted natively, as its twin, and under another arithmetic: the check of
the guide's "Your own Keras model under any arithmetic".

    convprobe identify --keras-model M.keras --configs onednn-off+fp16-acc --output map.json
    python scripts/twin_your_model.py M.keras D.npz map.json --config onednn-off+fp16-acc

In the configuration named (set before TensorFlow starts, with `convprobe.configure`), the
model is loaded, compiled with its saved loss and a LossScaleOptimizer around SGD, seeded, and fitted for
`--steps` steps of `--batch-size` images three times from the same weights: natively, in
``use_arithmetic(model, "twin", arithmetic_map=map.json)``, and in
``use_arithmetic(model, ARITHMETIC)`` (default ``v100:out=fp16``). It prints each run's
per-step losses, whether the twin's final fp32 weights and losses equal the native ones bit
for bit, whether the other arithmetic's differ, and what each block recorded for each
layer; with ``--json FILE`` the same as a document. Exit status 1 when the twin differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from convprobe.training.user_trainer import load_user_model, saved_batch_size  # (TensorFlow starts later)


def _fit(keras, np, path: Path, data, steps: int, batch: int, block=None):
    """Seeded weights and batches, `steps` steps of fit; per-step losses, final weights, record."""
    keras.utils.set_random_seed(0)
    model = load_user_model(str(path))  # compiled as saved: its loss is kept, its optimizer replaced
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss=model.loss,
                  jit_compile=False)
    losses: list[float] = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda _, logs: losses.append(float(logs["loss"])))
    x, y = data["x_train"][: steps * batch], data["y_train"][: steps * batch]
    fit = dict(batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[record])
    if block is None:
        model.fit(x, y, **fit)
        return losses, [w.numpy() for w in model.weights], None
    with block(model) as what_ran:
        model.fit(x, y, **fit)
    return losses, [w.numpy() for w in model.weights], what_ran


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("map", type=Path, help="identify's map of the model's layers")
    parser.add_argument("--config", required=True, help="a configuration of convprobe fingerprint --list-configs")
    parser.add_argument("--arithmetic", default="v100:out=fp16", help="the counterfactual (default: v100:out=fp16)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: the batch the model's input fixes, else 8")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import convprobe

    convprobe.configure(args.config)  # before TensorFlow starts
    args.batch_size = args.batch_size or saved_batch_size(str(args.model)) or 8
    import keras
    import numpy as np

    from convprobe.training import use_arithmetic

    data = np.load(args.data)
    runs = {
        "native": _fit(keras, np, args.model, data, args.steps, args.batch_size),
        "twin": _fit(keras, np, args.model, data, args.steps, args.batch_size,
                     lambda model: use_arithmetic(model, "twin", arithmetic_map=args.map)),
        args.arithmetic: _fit(keras, np, args.model, data, args.steps, args.batch_size,
                              lambda model: use_arithmetic(model, args.arithmetic)),
    }
    native_losses, native_weights, _ = runs["native"]

    def same(name: str) -> dict:
        losses, weights, _ = runs[name]
        return {"losses_equal": losses == native_losses,
                "weights_equal": all(np.array_equal(a.view(np.uint8), b.view(np.uint8))
                                     for a, b in zip(weights, native_weights))}

    results = {"config": args.config, "steps": args.steps, "batch_size": args.batch_size,
               "losses": {name: run[0] for name, run in runs.items()},
               "twin": same("twin"), "counterfactual": {"arithmetic": args.arithmetic, **same(args.arithmetic)},
               "records": {name: run[2] for name, run in runs.items() if run[2] is not None}}
    for name, (losses, _, _) in runs.items():
        print(f"{name:>16}: " + " ".join(f"{loss:.9g}" for loss in losses))
    print(f"twin == native, bit for bit: losses {results['twin']['losses_equal']}, final fp32 weights "
          f"{results['twin']['weights_equal']}")
    print(f"{args.arithmetic} == native: losses {results['counterfactual']['losses_equal']}, final fp32 weights "
          f"{results['counterfactual']['weights_equal']}")
    for name, record in results["records"].items():
        print(f"{name}: what each layer computed")
        for layer in record["layers"]:
            bias = f"  bias {layer['bias']['placement']}" if "bias" in layer else ""
            ops = ", ".join(f"{op} {cell['arithmetic']}" for op, cell in layer["ops"].items())
            print(f"  {layer['layer']} ({layer['kind']}): {ops}{bias}")
        for layer in record["not_computed"]:
            print(f"  {layer['layer']} ({layer['kind']}): not computed: {layer['reason']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if results["twin"]["losses_equal"] and results["twin"]["weights_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
