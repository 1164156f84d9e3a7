"""`_threads.over_tasks` and `over_items`: every task or item run exactly once, on every
thread count; errors and forked children."""

import contextlib
import multiprocessing
import threading

import numba
import numpy as np
import pytest
from numba import njit

from convprobe.emulation._threads import over_items, over_tasks


@njit(cache=False, nogil=True)
def _count(t0, t1, hits):
    for t in range(t0, t1):
        hits[t] += 1


@contextlib.contextmanager
def _numba_threads(threads):
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        yield
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 100])
def test_every_task_runs_exactly_once(threads, count):
    hits = np.zeros(count + 1, dtype=np.int64)  # one past the end, which no task may touch
    with _numba_threads(threads):
        over_tasks(_count, count, hits)
    assert hits[:count].tolist() == [1] * count and hits[count] == 0


def test_ranges_run_on_more_than_one_thread_and_a_kernel_error_reaches_the_caller():
    if numba.get_num_threads() < 2:
        pytest.skip("one numba thread: every range runs on the caller's")
    seen = []

    def kernel(t0, t1):
        seen.append((t0, t1, threading.get_ident()))
        if t0 > 0:
            raise ValueError(f"task range {t0}..{t1}")

    with pytest.raises(ValueError, match="task range"):
        over_tasks(kernel, 4)
    assert sorted(r[:2] for r in seen)[0] == (0, 4 // numba.get_num_threads())
    assert len({r[2] for r in seen}) == len(seen) > 1


def _in_child(queue):
    hits = np.zeros(50, dtype=np.int64)
    over_tasks(_count, 50, hits)
    queue.put(hits.tolist())


def test_a_forked_child_starts_its_own_pool():
    hits = np.zeros(50, dtype=np.int64)
    over_tasks(_count, 50, hits)  # the parent's pool exists before the fork
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and got == [1] * 50


def test_callers_on_several_threads_share_the_pool():
    """Callers on their own threads (identify predicts on several) each get all their tasks."""
    results = {}

    def caller(name):
        hits = np.zeros(333, dtype=np.int64)
        for _ in range(50):
            over_tasks(_count, 333, hits)
        results[name] = hits

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1, 2, 3]
    assert all((hits == 50).all() for hits in results.values())


@pytest.mark.parametrize("items, per_task, tasks", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (130, 64, 3)])
def test_items_go_per_task_with_the_last_task_taking_the_rest(items, per_task, tasks):
    hits = np.zeros(tasks + 1, dtype=np.int64)
    over_tasks(_count, items, hits, per_task=per_task)
    assert hits[:tasks].tolist() == [1] * tasks and hits[tasks] == 0


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("count", [0, 1, 2, 7])
def test_every_item_runs_exactly_once(threads, count):
    hits = np.zeros(count + 1, dtype=np.int64)
    with _numba_threads(threads):
        over_items(lambda item: _count(item, item + 1, hits), reversed(range(count)))
    assert hits[:count].tolist() == [1] * count and hits[count] == 0


def test_items_run_on_more_than_one_thread_and_an_error_reaches_the_caller_after_every_item():
    if numba.get_num_threads() < 2:
        pytest.skip("one numba thread: every item runs on the caller's")
    seen = []
    release = threading.Barrier(2, timeout=30)  # two items run at once, or this times out

    def function(item):
        if item < 2:
            release.wait()
        seen.append((item, threading.get_ident()))
        if item == 1:
            raise ValueError("item 1")

    with pytest.raises(ValueError, match="item 1"):
        over_items(function, range(6))
    assert sorted(item for item, _ in seen) == list(range(6))
    assert len({ident for _, ident in seen}) > 1
