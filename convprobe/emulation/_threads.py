"""The compiled kernels' tasks spread over threads.

A kernel here is a ``nogil`` numba function whose first two arguments are a range of
its tasks, ``[t0, t1)`` (row tiles, rows, ...). `over_tasks` runs the tasks as
contiguous ranges on up to ``numba.get_num_threads()`` threads, so NUMBA_NUM_THREADS
and `numba.set_num_threads` bound it as they bound ``prange``.

Why not ``parallel=True``: numba compiles a ``prange`` body a second time, in the
parfor's own module, which doubles the LLVM time of every kernel. Measured with a cold
cache: the block-FMA kernel's 32-bit lanes (`_block_fma_narrow`) took 95 s to compile
with ``prange`` and 44 s as a plain ``nogil`` loop, and each fresh process (each test
worker, each probe) pays it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numba

__all__ = ["over_items", "over_tasks", "default_float_environment"]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The process's pool, made once with numba's largest thread count (NUMBA_NUM_THREADS,
    which `numba.set_num_threads` cannot exceed), so no caller ever sees it replaced."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                numba.config.NUMBA_NUM_THREADS,  # type: ignore[attr-defined]  # set through numba.config's globals()
                thread_name_prefix="convprobe-kernel", initializer=_default_float_environment)
        return _pool


def _libm():
    """glibc's libm (its fegetenv and fesetenv), or None elsewhere."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    except OSError:
        return None


_LIBM = _libm()
#: glibc's FE_DFL_ENV, ``((const fenv_t *) -1)``: round to nearest, subnormals neither flushed
#: nor read as zero.
_FE_DFL_ENV = ctypes.c_void_p(-1)


def _default_float_environment() -> None:
    """A pool thread starts in the default floating-point environment. A thread inherits its
    creator's: a pool first used inside TensorFlow (an emulated layer's numpy_function, whose
    threads flush subnormals and read them as zero) would otherwise flush the float32
    subnormals some formats' products are (bf16's). Elsewhere than glibc it is left as it is."""
    if _LIBM is not None:
        _LIBM.fesetenv(_FE_DFL_ENV)


@contextlib.contextmanager
def default_float_environment():
    """This thread in the default floating-point environment for the block, its own restored
    after: where an emulated op runs inside TensorFlow, on TensorFlow's thread."""
    if _LIBM is None:
        yield
        return
    saved = ctypes.create_string_buffer(64)  # fenv_t: 32 bytes on x86-64 glibc
    _LIBM.fegetenv(saved)
    _LIBM.fesetenv(_FE_DFL_ENV)
    try:
        yield
    finally:
        _LIBM.fesetenv(saved)


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it starts its own pool."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def over_tasks(kernel, items: int, *args, per_task: int = 1) -> None:
    """kernel(t0, t1, *args) over its tasks, in contiguous ranges on threads: each task
    takes `per_task` of the `items` (a tile of rows, say), the last one the rest."""
    count = -(-items // per_task)
    threads = min(numba.get_num_threads(), count)
    if threads <= 1:
        kernel(0, count, *args)
        return
    bounds = [count * i // threads for i in range(threads + 1)]
    _at_once([functools.partial(kernel, bounds[i], bounds[i + 1], *args) for i in range(threads)])


def over_items(function, items) -> None:
    """function(item) for every item, on up to ``numba.get_num_threads()`` threads of the same
    pool, each thread taking the next item as it ends one: for tasks of unequal cost (give
    the costliest first) that a contiguous range of `over_tasks` would split unevenly."""
    items = list(items)
    threads = min(numba.get_num_threads(), len(items))
    if threads <= 1:
        for item in items:
            function(item)
        return
    queue, lock = iter(items), threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                item = next(queue, queue)  # (the iterator itself marks the end)
            if item is queue:
                return
            function(item)

    _at_once([drain] * threads)


def _at_once(calls) -> None:
    """The first call on this thread and each other on a thread of the pool, all at once;
    returns when every call has ended, re-raising the first error."""
    futures = [_executor().submit(call) for call in calls[1:]]
    try:
        calls[0]()
    finally:
        wait(futures)  # every call has ended before this returns or raises
    for future in futures:
        future.result()  # (re-raises a call's error here)
