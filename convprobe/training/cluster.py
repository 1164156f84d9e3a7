"""Multi-worker training on `tf.distribute.MultiWorkerMirroredStrategy`: the cluster and its rehearsal.

On a real cluster every machine runs the same ``convprobe train --distribute multi-worker``
command with its own ``TF_CONFIG`` (TensorFlow's cluster description: every worker's
host:port, and this process's index); worker 0 is the chief and writes the records.
`read_tf_config` checks that description before TensorFlow starts. `run_local_workers`
rehearses a cluster on one machine: N worker processes on 127.0.0.1 with generated
``TF_CONFIG``s, all stopped when one fails, when they finish or on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from convprobe.errors import InvalidArgument

__all__ = ["Cluster", "read_tf_config", "local_tf_configs", "run_local_workers", "MAX_LOCAL_WORKERS",
           "WORKER_MARK"]

MAX_LOCAL_WORKERS = 16
#: Set in the environment of the workers `run_local_workers` starts: a worker never starts workers.
WORKER_MARK = "CONVPROBE_LOCAL_WORKER"


@dataclass(frozen=True)
class Cluster:
    """This process's place in the cluster: every worker's address and its own index."""

    workers: tuple[str, ...]
    index: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def read_tf_config(environ=None) -> Cluster:
    """The cluster that ``TF_CONFIG`` describes, checked; one InvalidArgument line otherwise."""
    env = os.environ if environ is None else environ
    text = env.get("TF_CONFIG")
    example = ('{"cluster": {"worker": ["host0:12345", "host1:12345"]}, "task": {"type": "worker", '
               '"index": 0}}')
    if not text:
        raise InvalidArgument(f"--distribute multi-worker needs TF_CONFIG in the environment, e.g. {example} "
                              f"(or rehearse on this machine with --local-workers N)")
    try:
        spec = json.loads(text)
        workers = spec["cluster"]["worker"]
        task = spec["task"]
        kind, index = task["type"], task["index"]
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument(f"TF_CONFIG must be JSON like {example}; received {text[:80]!r}") from None
    if set(spec["cluster"]) - {"worker"}:
        raise InvalidArgument(f"TF_CONFIG's cluster may hold only 'worker' jobs (worker 0 is the chief); "
                              f"received {sorted(spec['cluster'])}")
    if not isinstance(workers, list) or not all(isinstance(w, str) and ":" in w for w in workers):
        raise InvalidArgument(f"TF_CONFIG's cluster.worker must be a list of host:port; received {workers!r}")
    if len(workers) < 2:
        raise InvalidArgument(f"TF_CONFIG's cluster.worker must list at least 2 workers (one machine trains "
                              f"without --distribute); received {workers!r}")
    if kind != "worker" or not isinstance(index, int) or not 0 <= index < len(workers):
        raise InvalidArgument(f"TF_CONFIG's task must be a worker with an index from 0 to {len(workers) - 1}; "
                              f"received {task!r}")
    return Cluster(tuple(workers), index)


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_tf_configs(n: int) -> list[str]:
    """``TF_CONFIG`` of each of `n` workers on 127.0.0.1, on free ports."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(n)]
    return [json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
            for i in range(n)]


def run_local_workers(argv: list[str], n: int) -> int:
    """Run ``convprobe train ARGV`` as `n` local workers; the chief's output goes to this
    terminal, the others' to log files shown if they fail. Returns the first non-zero exit
    code (every other worker is stopped then), else 0."""
    if not 2 <= n <= MAX_LOCAL_WORKERS:
        raise InvalidArgument(f"--local-workers must be an integer from 2 to {MAX_LOCAL_WORKERS}; received {n}")
    if os.environ.get(WORKER_MARK):
        raise InvalidArgument("--local-workers cannot be used inside a worker that --local-workers started")
    logs = Path(tempfile.mkdtemp(prefix="convprobe-workers-"))
    procs, handles = [], []
    try:
        for i, tf_config in enumerate(local_tf_configs(n)):
            env = {**os.environ, "TF_CONFIG": tf_config, "TF_CPP_MIN_LOG_LEVEL": "2", WORKER_MARK: "1"}
            if i == 0:
                out = err = None
            else:
                out = err = (logs / f"worker{i}.log").open("w")
                handles.append(out)
            procs.append(subprocess.Popen([sys.executable, "-m", "convprobe", "train", *argv],
                                          env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL))
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                if i:
                    tail = (logs / f"worker{i}.log").read_text(errors="replace").strip().splitlines()[-5:]
                    print(f"convprobe train: worker {i} of {n} exited with {code}; its last lines:\n  "
                          + "\n  ".join(tail), file=sys.stderr)
                return code
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for handle in handles:
            handle.close()
        shutil.rmtree(logs, ignore_errors=True)
