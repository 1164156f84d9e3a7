"""Multi-worker training on `tf.distribute.MultiWorkerMirroredStrategy`: the cluster and its rehearsal.

On a real cluster every machine runs the same ``convprobe train --distribute multi-worker``
command with its own ``TF_CONFIG`` (TensorFlow's cluster description: every worker's
host:port, and this process's index); worker 0 is the chief and writes the records.
`read_tf_config` checks that description, every value's type included, before TensorFlow
starts. `run_local_workers` rehearses a cluster on one machine: N worker processes on
127.0.0.1 with generated ``TF_CONFIG``s, all stopped when one fails, when they finish, on
SIGTERM or on SIGINT.

A worker never trains in the process that receives the signals. While TensorFlow waits
for its peers (in the strategy's constructor) it blocks in C++ *holding the GIL*, so no
Python signal handler or thread can run, and it replaces SIGTERM's handler with its own
preemption notifier, which only records the signal: a worker with unreachable peers
ignores SIGTERM and SIGINT for as long as it waits. So `run_worker` and
`run_local_workers` train in children (`convprobe.children`: they die with this
process, even by SIGKILL) and stay in Python themselves, where SIGTERM and SIGINT stop
every worker at once (SIGKILL, since TensorFlow would swallow SIGTERM; records are
written atomically, so the run directory resumes) with one line on stderr and exit code
128 + the signal's number.
"""

from __future__ import annotations

import json
import reprlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from convprobe import children
from convprobe.errors import InvalidArgument, is_integer

__all__ = ["Cluster", "read_tf_config", "local_tf_configs", "run_local_workers", "run_worker",
           "MAX_LOCAL_WORKERS", "WORKER_MARK"]

MAX_LOCAL_WORKERS = 16
#: Set in the environment of the workers `run_worker` and `run_local_workers` start: such a
#: worker trains in its own process and never starts workers.
WORKER_MARK = "CONVPROBE_LOCAL_WORKER"
#: The signals that stop a supervised run.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Cluster:
    """This process's place in the cluster: every worker's address and its own index."""

    workers: tuple[str, ...]
    index: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def _is_address(worker: object) -> bool:
    """Whether `worker` is "host:port" with a port from 1 to 65535."""
    if not isinstance(worker, str):
        return False
    host, colon, port = worker.rpartition(":")
    return bool(host and colon and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)


def _shown(value) -> str:
    """`value` for a one-line message: its repr, or reprlib's short one where it is long or
    nested too deeply to print."""
    try:
        text = repr(value)
    except RecursionError:
        return reprlib.repr(value)
    return text if len(text) <= 200 else reprlib.repr(value)


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
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested deeper than JSON parses
        raise InvalidArgument(f"TF_CONFIG must be JSON like {example}; received {text[:80]!r}") from None
    if not isinstance(spec["cluster"], dict) or set(spec["cluster"]) - {"worker"}:
        raise InvalidArgument(f"TF_CONFIG's cluster may hold only 'worker' jobs (worker 0 is the chief); "
                              f"received {sorted(spec['cluster'])}")
    if not isinstance(workers, list) or not all(_is_address(w) for w in workers):
        raise InvalidArgument(f"TF_CONFIG's cluster.worker must be a list of host:port, each port from 1 to "
                              f"65535; received {_shown(workers)}")
    if len(workers) < 2:
        raise InvalidArgument(f"TF_CONFIG's cluster.worker must list at least 2 workers (one machine trains "
                              f"without --distribute); received {_shown(workers)}")
    if len(set(workers)) != len(workers):
        raise InvalidArgument(f"TF_CONFIG's cluster.worker must list each host:port once; received {_shown(workers)}")
    if kind != "worker" or not is_integer(index) or not 0 <= index < len(workers):
        raise InvalidArgument(f"TF_CONFIG's task must be a worker with an index from 0 to {len(workers) - 1}; "
                              f"received {_shown(task)}")
    return Cluster(tuple(workers), int(index))


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
    code (every other worker is stopped then), 128 + the signal's number on SIGTERM or
    SIGINT, else 0."""
    if not is_integer(n) or not 2 <= n <= MAX_LOCAL_WORKERS:
        raise InvalidArgument(f"--local-workers must be an integer from 2 to {MAX_LOCAL_WORKERS}; received {n!r}")
    if os.environ.get(WORKER_MARK):
        raise InvalidArgument("--local-workers cannot be used inside a worker that --local-workers started")
    return _supervise(argv, local_tf_configs(n), f"the {n} local workers were")


def run_worker(argv: list[str]) -> int:
    """Run ``convprobe train ARGV`` as this machine's worker of the cluster that ``TF_CONFIG``
    describes, in a child, so that SIGTERM and SIGINT stop it even while it waits for its
    peers (see the module's docstring). Returns its exit code, or 128 + the signal's number."""
    cluster = read_tf_config()
    return _supervise(argv, [os.environ["TF_CONFIG"]], f"worker {cluster.index} was")


def _supervise(argv: list[str], tf_configs: list[str], stopped_what: str) -> int:
    """Run one worker per ``TF_CONFIG`` and wait for them in Python, where signals are handled."""
    received: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda signum, _frame: received.append(signum)) for s in STOP_SIGNALS}
    n = len(tf_configs)
    procs, logs = [], []
    try:
        for i, tf_config in enumerate(tf_configs):
            if received:
                break
            env = {**os.environ, "TF_CONFIG": tf_config, WORKER_MARK: "1"}
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            # The first worker writes to this terminal, the others to unlinked files: nothing stays on disk.
            log = None if i == 0 else tempfile.TemporaryFile("w+", prefix="convprobe-worker-")
            if log is not None:
                logs.append(log)
            # Its own session: a Ctrl-C at the terminal reaches this process alone, which stops all.
            procs.append(children.popen("convprobe", ["train", *argv], env=env, stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL, start_new_session=True))
        while not received:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                if i:
                    logs[i - 1].seek(0)
                    tail = logs[i - 1].read().strip().splitlines()[-5:]
                    print(f"convprobe train: worker {i} of {n} exited with {code}; its last lines:\n  "
                          + "\n  ".join(tail), file=sys.stderr)
                return code
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
        signum = received[0]
        print(f"convprobe train: stopped by {signal.Signals(signum).name}; {stopped_what} stopped", file=sys.stderr)
        return 128 + signum
    finally:
        for p in procs:  # SIGKILL: TensorFlow's own SIGTERM handler would only take note
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        for log in logs:
            log.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
