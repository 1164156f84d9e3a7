"""Benchmark: the whole fingerprint matrix against N x one fresh-process TensorFlow import.

Each environment must run in its own process (TensorFlow caches its precision
switches), so the floor for N configurations run one after another is N fresh
imports. Running them in parallel (one child per core) and sharing a process
between configurations that differ only in jit_compile should beat that:
goal <= 0.7 x (N x import) on 2 cores. The machine should be otherwise idle:
with other work running, parallel children only compete for the same cores.

    /work/venv/bin/python benchmarks/bench_matrix.py [--configs NAMES] [--op OPS] [--repeat 3]

Prints the import time (median of --repeat fresh processes), the matrix wall
time, and the ratio; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def fresh_import_seconds(repeat: int) -> float:
    """Median wall time of `python -c "import tensorflow"` in a fresh process (quiet logging)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, check=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=None, help="matrix rows (default: the matrix's default rows)")
    parser.add_argument("--op", default="all", help="ops (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh imports to time (default: 3)")
    parser.add_argument("--jobs", type=int, default=None, help="children at once (default: cores)")
    args = parser.parse_args(argv)

    from convprobe.backends.configurations import matrix_configs
    from convprobe.probes.fingerprint_ops import check_ops
    from convprobe.probes.fingerprint import run_grouped

    configs = matrix_configs("cpu", args.configs)
    ops = list(check_ops(args.op))
    one_import = fresh_import_seconds(args.repeat)
    started = time.perf_counter()
    results = run_grouped(configs, {"ops": ops}, timeout=900, jobs=args.jobs)
    children = len({(c.device, tuple(sorted(c.env.items()))) for c in configs})
    wall = time.perf_counter() - started
    serial_floor = len(configs) * one_import
    statuses = {r.status for r in results}
    print(f"cores: {len(os.sched_getaffinity(0))}; configurations: {len(configs)} in {children} processes "
          f"(jit on/off share one); ops: {len(ops)}; statuses: {sorted(statuses)}")
    print(f"one fresh TensorFlow import: {one_import:.2f} s (median of {args.repeat})")
    print(f"N x import: {serial_floor:.1f} s")
    print(f"whole matrix wall time: {wall:.1f} s (per child: {', '.join(f'{r.wall_s:.1f}' for r in results)})")
    print(f"ratio: {wall / serial_floor:.2f} (goal <= 0.70)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
