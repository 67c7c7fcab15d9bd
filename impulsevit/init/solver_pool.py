"""The worker threads of the ``vit`` solves: :func:`solver_threads` runs pure, generator-free tasks (SVDs, eigen
solves) on ``torch.get_num_threads()`` threads while the caller keeps drawing random numbers on its own thread, and
:func:`run_parallel` runs a list of them. The standard ``ThreadPoolExecutor``; what is written here is only the
intra-op thread discipline that keeps the results independent of the thread count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

__all__ = ["Submit", "run_parallel", "solver_threads"]


_T = TypeVar("_T")
Submit = Callable[[Callable[[], Any]], Future[Any]]
"""``submit(task) -> Future``: starts a pure, generator-free task (see :func:`solver_threads`)."""


def _run_inline(task: Callable[[], _T]) -> Future[_T]:
    """Run ``task`` now, on this thread; its result or exception in a done ``Future`` (as from a worker)."""
    done: Future[_T] = Future()
    try:
        done.set_result(task())
    except BaseException as exc:  # re-raised by .result(), as from a worker
        done.set_exception(exc)
    return done


@contextlib.contextmanager
def solver_threads() -> Iterator[Submit]:
    """Worker threads for the solves: yields ``submit(task) -> Future``, which runs pure, generator-free tasks on
    ``torch.get_num_threads()`` worker threads while the caller keeps drawing random numbers on its own thread
    (LAPACK / BLAS release the GIL).

    Inside the ``with`` block torch uses one intra-op thread (the tasks are the parallelism, no oversubscription); the
    caller's setting is restored on exit, also on error. With one thread, tasks run at ``submit``, on the caller's
    thread. Results never depend on the thread count: every draw happens on the calling thread, in program order.
    """
    threads = torch.get_num_threads()
    # each worker sets its own intra-op count (OpenMP's is per thread: left at the default, every worker ran
    # BLAS/LAPACK on all cores and the impulse solve differed from run to run by ~1e-5)
    pool = ThreadPoolExecutor(threads, initializer=torch.set_num_threads, initargs=(1,)) if threads > 1 else None
    try:
        if pool is not None:
            torch.set_num_threads(1)
        yield pool.submit if pool is not None else _run_inline
    finally:
        try:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        finally:
            torch.set_num_threads(threads)


def run_parallel(tasks: Sequence[Callable[[], _T]]) -> list[_T]:
    """All ``tasks`` on :func:`solver_threads`; results in task order."""
    with solver_threads() as submit:
        futures = [submit(t) for t in tasks]
        return [f.result() for f in futures]
