"""The compiled kernels' tasks spread over threads.

A kernel here is a ``nogil`` numba function whose first two arguments are a range of
its tasks, ``[t0, t1)`` (row tiles, rows, ...). `over_tasks` runs ``count`` tasks as
contiguous ranges on up to ``numba.get_num_threads()`` threads, so NUMBA_NUM_THREADS
and `numba.set_num_threads` bound it as they bound ``prange``.

Why not ``parallel=True``: numba compiles a ``prange`` body a second time, in the
parfor's own module, which doubles the LLVM time of every kernel. Measured with a cold
cache: the block-FMA kernel's 32-bit lanes (`_block_fma_narrow`) took 95 s to compile
with ``prange`` and 44 s as a plain ``nogil`` loop, and each fresh process (each test
worker, each probe) pays it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numba

__all__ = ["over_tasks"]

_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    if _pool is None or _pool_size < threads:
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool, _pool_size = ThreadPoolExecutor(threads, thread_name_prefix="convprobe-kernel"), threads
    return _pool


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it starts its own pool."""
    global _pool, _pool_size
    _pool, _pool_size = None, 0


os.register_at_fork(after_in_child=_forget_pool)


def over_tasks(kernel, count: int, *args) -> None:
    """kernel(t0, t1, *args) over tasks 0 .. count - 1, in contiguous ranges on threads."""
    threads = min(numba.get_num_threads(), count)
    if threads <= 1:
        kernel(0, count, *args)
        return
    bounds = [count * i // threads for i in range(threads + 1)]
    pool = _executor(threads)
    futures = [pool.submit(kernel, bounds[i], bounds[i + 1], *args) for i in range(1, threads)]
    kernel(bounds[0], bounds[1], *args)  # the first range on this thread
    for future in futures:
        future.result()  # (re-raises a kernel's error here)
