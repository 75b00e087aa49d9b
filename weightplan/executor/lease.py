"""No SIGBUS: read leases keep files from being truncated under a mapped window.

A file truncated by another process while a window of it is mapped kills the process with
SIGBUS the moment a copy touches a page past the new end. On Linux, :class:`LeaseGuard`
takes a read lease (``F_SETLEASE``) on every checkpoint file for the duration of a load:
a process that opens one for writing or truncates it is held by the kernel (up to
``/proc/sys/fs/lease-break-time``, 45 s by default) and this process gets ``SIGIO``. The
handler marks the load as broken: no new window is mapped (those reads raise
:class:`StaleCheckpointError`), and the leases are released as soon as the windows in
flight are copied, which lets the writer go on. The load fails with a typed error; no
page is touched after the file shrank.

Where a lease can't be taken (another process already has the file open for writing, the
file belongs to another user, not Linux, or ``execute()`` runs outside the main thread,
where no signal handler can be installed) the file is never mapped: the reader reads it
with ``preadv`` (:mod:`~weightplan.executor.reader`), where a truncation is a short read,
and the fingerprint checks before and after execution catch any other change.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from weightplan.errors import StaleCheckpointError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]


class LeaseGuard:
    """Read leases on a load's files, and the bookkeeping of windows in flight."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the SIGIO handler may interrupt its own thread
        self._inflight = 0
        self._broken = False
        self._leased: list[int] = []
        self._previous: Any = None  # the SIGIO handler before ours
        self._installed = False

    @property
    def guarded(self) -> bool:
        return bool(self._leased)

    def holds(self, fd: int) -> bool:
        """Whether ``fd`` is under this guard's lease (only such a file may be mapped)."""
        return fd in self._leased

    def start(self, fds: Iterable[int]) -> None:
        """Lease every file that can be leased; install the SIGIO handler (main thread)."""
        if (fcntl is None or not hasattr(fcntl, "F_SETLEASE")
                or threading.current_thread() is not threading.main_thread()):
            return
        try:
            self._previous = signal.signal(signal.SIGIO, self._on_break)
            self._installed = True
        except (ValueError, OSError):
            return
        for fd in fds:
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
                self._leased.append(fd)
            except OSError:
                pass  # open for writing elsewhere, or not ours: unguarded

    def _on_break(self, signum: int, frame: object) -> None:
        with self._lock:
            self._broken = True
            if self._inflight == 0:
                self._release()

    def _release(self) -> None:
        for fd in self._leased:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        self._leased.clear()

    @contextlib.contextmanager
    def mapping(self, path: str) -> Iterator[None]:
        """Around one mapped window: refuse it once the file is being changed."""
        with self._lock:
            self._check(path)
            self._inflight += 1
            if self._broken:  # the handler ran between the check and the count
                self._inflight -= 1
                self._check(path)
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1
                if self._broken and self._inflight == 0:
                    self._release()

    def _check(self, path: str) -> None:
        if self._broken:
            raise StaleCheckpointError("another process opened a checkpoint file for writing "
                                       "or truncated it during the load; nothing was "
                                       "installed. Call explain() again", file=path)

    def stop(self) -> None:
        """Release the leases and put the previous SIGIO handler back."""
        with self._lock:
            self._release()
        if self._installed:
            signal.signal(signal.SIGIO, self._previous if self._previous is not None
                          else signal.SIG_DFL)
            self._installed = False
