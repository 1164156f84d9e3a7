"""Benchmark: identify at one layer, in every default configuration, against its floor.

Run: ``python benchmarks/bench_identify.py [--input-shape 1,8,8,256] [--filter-shape 3,3,256,8]``

The floor is what identify cannot avoid: one TensorFlow process per configuration (each
with its own environment, as identify starts them, two at a time on two cores) that
imports TensorFlow and runs the layer's conv2d once. The run is
``convprobe identify --input-shape ... --filter-shape ...`` (every default configuration,
forward conv and both gradients). Both are timed (wall clock) in this one run; the goal
is identify within 2x of the floor.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from convprobe.backends.configurations import matrix_configs
from convprobe.backends.isolation import child_environment

_ONE_CONV = """
import numpy as np, tensorflow as tf
x = tf.constant(np.ones({x}, np.float16)); w = tf.constant(np.ones({w}, np.float16))
conv = tf.function(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), jit_compile={jit})
conv(x, w).numpy()
"""


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def floor_seconds(x_shape, w_shape, jobs: int) -> float:
    """Wall seconds to start every default configuration's process and run one conv in each."""
    def one(config) -> None:
        code = _ONE_CONV.format(x=x_shape, w=w_shape, jit=config.jit_compile)
        subprocess.run([sys.executable, "-c", code], env=child_environment(config), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    start = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, matrix_configs("cpu")))
    return time.perf_counter() - start


def identify_seconds(x_shape, w_shape, jobs: int) -> float:
    """Wall seconds of ``convprobe identify`` at the layer in every default configuration."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "convprobe", "identify", "--input-shape", ",".join(map(str, x_shape)),
                   "--filter-shape", ",".join(map(str, w_shape)), "--jobs", str(jobs),
                   "--output", str(Path(tmp) / "layer.json")]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-shape", default="1,8,8,256")
    parser.add_argument("--filter-shape", default="3,3,256,8")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    x_shape, w_shape = _shape(args.input_shape), _shape(args.filter_shape)
    configs = [c.name for c in matrix_configs("cpu")]
    print(f"layer {x_shape} * {w_shape}; {len(configs)} configurations ({', '.join(configs)}); {args.jobs} at a time")
    floor = floor_seconds(x_shape, w_shape, args.jobs)
    run = identify_seconds(x_shape, w_shape, args.jobs)
    print(f"floor (start each configuration's TensorFlow, one conv2d): {floor:8.1f} s")
    print(f"convprobe identify at the layer:                         {run:8.1f} s   {run / floor:5.1f}x the floor "
          f"(goal: at most 2x)")


if __name__ == "__main__":
    main()
