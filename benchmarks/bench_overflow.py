"""Benchmark: `convprobe overflow` wall time against its floor, in one run.

The floor of any TensorFlow probe is a fresh Python process that imports
TensorFlow and runs one fp16 conv: convprobe must start such a process per
configuration (the runtime caches its precision switches). Goals (issue 2):
`overflow --accumulate fp16` <= 1.5x the floor; `--accumulate all` (three
configurations, run in parallel) well under 3x the floor on a multi-core machine.

Run: python benchmarks/bench_overflow.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

FLOOR = (
    "import numpy as np, tensorflow as tf\n"
    "x = tf.constant(np.full((1, 1, 4, 1), 65519, np.float16))\n"
    "w = tf.constant(np.array([65519, -65519], np.float16).reshape(1, 2, 1, 1))\n"
    "print(tf.nn.conv2d(x, w, 1, 'VALID').numpy().ravel())\n"
)

CASES = {
    "floor: python -c 'import tensorflow; one fp16 conv'": [sys.executable, "-c", FLOOR],
    "convprobe overflow --accumulate fp16 --backend tensorflow": [
        sys.executable, "-m", "convprobe", "overflow", "--accumulate", "fp16", "--backend", "tensorflow"],
    "convprobe overflow --accumulate fp16 (tensorflow + emulated)": [
        sys.executable, "-m", "convprobe", "overflow", "--accumulate", "fp16"],
    "convprobe overflow --accumulate all --backend tensorflow (3 configs)": [
        sys.executable, "-m", "convprobe", "overflow", "--accumulate", "all", "--backend", "tensorflow"],
}


def _time(cmd: list[str]) -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CONV2D_USE_FP16_ACCUMULATE": "1"}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; repeats: {args.repeats} (interleaved); median wall seconds")
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for name in CASES:  # warm caches (numba, file system) once
        _time(CASES[name])
    for _ in range(args.repeats):
        for name, cmd in CASES.items():
            samples[name].append(_time(cmd))
    floor = statistics.median(next(iter(samples.values())))
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{median:7.2f} s  {median / floor:5.2f}x floor  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
