"""The executor's pool for a plan with in-place updates (a merged adapter): threads that each
run torch's ops on one intra-op thread.

A merge's arithmetic comes in pieces (:meth:`ConversionOp.update`) that the pool runs side by
side; each piece's ops are a cache's worth, too small to share, and an OpenMP team waits at
every op for its slowest thread (on a busy machine, a descheduled one: tens of times the
op's own time), so each pool thread holds torch at one thread of its own.

torch's thread count is per thread, but setting it also makes it the count that threads
started later take at their first parallel op: the pool's threads are started here, under
a lock, each sets its own count, and torch's default is then put back from a throwaway
thread. The calling thread's count is never touched; a thread elsewhere that runs its first
parallel op in that window (the pool's start) takes one thread. A thread that fails to set
itself up aborts the start at once (an :class:`ExecutionError` naming the cause), instead of
leaving the others at the start barrier until its timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from weightplan.errors import ExecutionError

_LOCK = threading.Lock()
START_TIMEOUT_S = 60.0


def single_threaded_pool(threads: int) -> ThreadPoolExecutor:
    """``threads`` started threads, each holding torch at one intra-op thread.

    Raises:
        ExecutionError: a thread failed to start or to set its count (the cause chained),
            at once: the others, waiting for all to start, are released.
    """
    failed: list[BaseException] = []
    started = threading.Barrier(threads + 1, timeout=START_TIMEOUT_S)

    def set_up() -> None:  # (an initializer that raises would break the pool silently)
        try:
            _one_thread()
        except BaseException as e:
            failed.append(e)

    def arrive() -> None:  # a thread that failed its set-up releases the others
        if failed:
            started.abort()
        started.wait()

    with _LOCK:
        default = _in_new_thread(torch.get_num_threads)  # (what a new thread starts with)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="weightplan", initializer=set_up)
        try:
            waits = [pool.submit(arrive) for _ in range(threads)]  # (each blocks
            started.wait()  # until all have started: every submit starts a thread)
            for wait in waits:
                wait.result()
        except BaseException as e:
            started.abort()
            pool.shutdown(wait=False, cancel_futures=True)
            if failed:
                raise ExecutionError(f"a thread of the merge pool failed to start: "
                                     f"{type(failed[0]).__name__}: {failed[0]}") from failed[0]
            if isinstance(e, threading.BrokenBarrierError):
                raise ExecutionError(f"the merge pool's {threads} threads did not all start "
                                     f"within {START_TIMEOUT_S:g} s") from e
            raise
        finally:
            _in_new_thread(lambda: torch.set_num_threads(default))
    return pool


def _one_thread() -> None:
    torch.get_num_threads()  # (this thread's count is set from the default first, once;
    torch.set_num_threads(1)  # else its first parallel op would undo this)


def _in_new_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # (raised again in the caller's thread)
            failed.append(e)

    thread = threading.Thread(target=run, name="weightplan-threads")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]
