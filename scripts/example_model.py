"""A small Keras model of every layer kind convprobe computes, and data for it: the user's model
of the guide's "Your own Keras model" walk-through and of issue 59's checks.

    python scripts/example_model.py --output DIR     # writes DIR/M.keras and DIR/D.npz

M is functional, under ``mixed_float16``, with a fixed batch of 8 (identify measures the
layers at it and the twin reproduces `fit` at it): Conv2D with a bias and ReLU,
DepthwiseConv2D (depth multiplier 2), SeparableConv2D, a strided Conv2DTranspose, global
pooling, Dense, and a float32 softmax. It is compiled with SGD and sparse categorical
cross-entropy. D holds 64 seeded training images of 8x8x3 and labels 0-9 (x_train,
y_train) and 16 test ones (x_test, y_test). Seeded: the same files on every run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

#: The batch size the model's input fixes.
BATCH = 8


def build():
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = keras.Input((8, 8, 3), batch_size=BATCH)
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
        x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="depthwise")(x)
        x = keras.layers.SeparableConv2D(6, 3, padding="same", name="separable")(x)
        x = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="transpose")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        x = keras.layers.Dense(10, name="dense")(x)
        outputs = keras.layers.Activation("softmax", dtype="float32", name="softmax")(x)
        model = keras.Model(inputs, outputs, name="example")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (80, 8, 8, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 80)
    return {"x_train": images[:64], "y_train": labels[:64], "x_test": images[64:], "y_test": labels[64:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="the directory to write M.keras and D.npz in")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    args.output.mkdir(parents=True, exist_ok=True)
    build().save(args.output / "M.keras")
    np.savez(args.output / "D.npz", **data())
    print(f"wrote {args.output / 'M.keras'} and {args.output / 'D.npz'}")


if __name__ == "__main__":
    main()
