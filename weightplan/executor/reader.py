"""Byte-range reads from checkpoint files: straight into the destination, or a window.

Three ways to move bytes, chosen per file when the reader opens it (and per destination):

* :meth:`Reader.read_into` ``preadv``\\ s a byte range straight into the destination's
  memory, in requests of :data:`REQUEST_BYTES`, after a ``POSIX_FADV_WILLNEED`` hint for
  the whole range: one copy, the disk queue kept full by the reader threads (queue depth =
  threads), no page-fault storm on a mapped source, and a file truncated underneath gives
  a short read (:class:`TruncatedCheckpointError`) instead of ``SIGBUS``. It is what a
  *cold* file (not in the page cache) gets.
* :meth:`Reader.window` maps exactly a byte range for the duration of a block; the
  caller copies out of it (strided reads, and direct reads of *warm* files). From a warm
  page cache the cost of a load is faulting in fresh destination pages, and a user-space
  ``copy_`` out of a mapping lets torch's parallel copy fault them faster than ``pread``
  faults them in kernel context (measured on the 1.5 GB benchmark checkpoint: 1.2-1.6 s
  with ``pread``, 0.43-0.49 s mapped).

* :meth:`Reader.copy_into` copies a byte range into a *file* (a tensor streamed to the
  offload folder, a shard a convert writes straight) in the kernel, ``copy_file_range``,
  warm or cold: no mapping, no copy through user memory. Where the kernel can't copy
  between the two files (another filesystem), a window is copied from instead.

Only a file under a read lease is ever mapped (:mod:`~weightplan.executor.lease`: a
truncation then waits until the window is copied). A file without one (``execute()`` in a
worker thread, where no ``SIGIO`` handler can be installed; a file another process has
open for writing; not Linux) is read with ``preadv`` only: direct reads straight into the
destination, other windows into a buffer of their own. A file truncated underneath then
gives a short read and :class:`TruncatedCheckpointError`, never ``SIGBUS``, from any thread.

A file is *warm* when a few probes (``preadv(..., RWF_NOWAIT)``, which fails instead of
waiting for the disk) at its start, middle and end all find their bytes cached.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from weightplan.errors import (
    CheckpointError, ExecutionError, OpenFileLimitError, StaleCheckpointError, TruncatedCheckpointError,
)
from weightplan.executor.fd_limit import limit_hint, out_of_descriptors  # (not lazily: no fd left)
from weightplan.executor.lease import LeaseGuard
from weightplan.planner.inputs.checkpoint import Checkpoint, FileStamp
from weightplan.planner.inputs.fingerprint import check_unchanged
from weightplan.planner.inputs.paths import open_regular

REQUEST_BYTES = 8 * 1024 * 1024  # one preadv request: large enough to stream, small to overlap
IO_DEPTH = 4  # preadv requests in flight per read (the floor in benchmarks/load.py uses 4)
_PROBE_BYTES = 4096
# copy_file_range can't copy between these two files (other filesystems, old kernels)
_NO_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})
_PROBES = 5


class Reader:
    """Open file descriptors for a checkpoint; checks each file is unchanged since planning."""

    def __init__(self, checkpoint: Checkpoint):
        self._fds: dict[str, int] = {}
        self._stamps = {stamp.path: stamp for stamp in checkpoint.files}
        self._lease = LeaseGuard()  # no SIGBUS: see executor/lease.py
        self._cold: set[str] = set()  # files (partly) missing from the page cache when opened
        self._mappable: set[str] = set()  # leased files: the only ones ever mapped
        self._no_copy: set[tuple[str, str]] = set()  # (checkpoint, output) pairs the kernel
        # can't copy between (by path: a closed output's descriptor number is reused)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        try:
            for stamp in checkpoint.files:
                self._open(stamp)
            self._lease.start(self._fds.values())
            self._mappable = {p for p, fd in self._fds.items() if self._lease.holds(fd)}
            self.verify(when="since the plan was made")  # size, times, inode, header SHA-256
        except BaseException:
            self.close()
            raise

    def _open(self, stamp: FileStamp) -> None:
        try:
            fd = open_regular(stamp.path)
        except CheckpointError as e:
            if out_of_descriptors(e.__cause__):  # not a change of the file: say which limit
                assert isinstance(e.__cause__, OSError)
                raise OpenFileLimitError(f"{stamp.path}: can't open this checkpoint file: "
                                         + limit_hint(e.__cause__, len(self._stamps),
                                                      "the load")) from e.__cause__
            reason = str(e).removeprefix(f"{stamp.path}: ")
            raise StaleCheckpointError(f"the file changed since the plan was made ({reason}); "
                                       "call explain() again", file=stamp.path) from e
        self._fds[stamp.path] = fd
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        if not is_cached(fd, stamp.size):
            self._cold.add(stamp.path)

    def reads_straight(self, path: str) -> bool:
        """Whether direct reads of ``path`` go straight into the destination
        (:meth:`read_into`): a cold file, or one that may not be mapped (no lease)."""
        return path in self._cold or path not in self._mappable

    def read_into(self, path: str, offset: int, dest: torch.Tensor) -> None:
        """Read ``dest.numel()`` bytes at ``offset`` of ``path`` into ``dest`` (a contiguous
        ``uint8`` CPU tensor, usually a slice of the final parameter)."""
        fd, nbytes = self._fds[path], dest.numel()
        if hasattr(os, "posix_fadvise"):  # the whole range is queued at once
            os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
        buffer = memoryview(dest.numpy()).cast("B")  # type: ignore[arg-type]  # numpy buffer
        starts = range(0, nbytes, REQUEST_BYTES)
        if len(starts) == 1:
            self._request(path, fd, buffer, offset, 0, nbytes)
            return
        futures = [self._io().submit(self._request, path, fd, buffer, offset, start,
                                     min(nbytes, start + REQUEST_BYTES)) for start in starts]
        for future in futures:
            future.result()

    def copy_into(self, path: str, offset: int, nbytes: int, out: int, at: int,
                  out_path: str) -> bool:
        """Copy ``nbytes`` at ``offset`` of ``path`` to byte ``at`` of the open file ``out``
        (``out_path``) in the kernel (``copy_file_range``: page cache to page cache, no
        mapping, no copy through user memory; a file truncated underneath gives a short
        copy, never ``SIGBUS``). False, having copied nothing, when the kernel can't copy
        between these two files (another filesystem, not Linux): the caller copies out of
        a window.

        Raises:
            TruncatedCheckpointError: ``path`` shrank under the copy.
            ExecutionError: the copy failed otherwise (a full disk: names both files).
        """
        if not hasattr(os, "copy_file_range") or (path, out_path) in self._no_copy:
            return False
        fd, done = self._fds[path], 0
        if hasattr(os, "posix_fadvise"):  # the whole range is queued at once
            os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
        while done < nbytes:
            try:
                got = os.copy_file_range(fd, out, nbytes - done, offset + done, at + done)
            except OSError as e:
                if done or e.errno not in _NO_COPY:
                    raise ExecutionError(f"copying bytes {offset}..{offset + nbytes} of {path} "
                                         f"into {out_path} at byte {at} failed: {e}") from e
                self._no_copy.add((path, out_path))
                return False
            if got <= 0:
                raise TruncatedCheckpointError(
                    f"bytes {offset + done}..{offset + nbytes} are past the end of the file "
                    "(it shrank during the load)", file=path)
            done += got
        return True

    def read_runs(self, path: str, offsets: Iterable[int], run: int, dest: torch.Tensor
                  ) -> None:
        """Read ``run`` bytes at each of ``offsets`` (ascending) of ``path`` into ``dest``
        back to back (a contiguous ``uint8`` CPU tensor): a strided read's segments, one
        ``preadv`` each, nothing between them requested."""
        fd = self._fds[path]
        buffer = memoryview(dest.numpy()).cast("B")  # type: ignore[arg-type]  # numpy buffer
        at = 0
        for offset in offsets:
            self._request(path, fd, buffer[at:at + run], offset, 0, run)
            at += run

    def _io(self) -> ThreadPoolExecutor:
        """The requests of one read run in parallel: the disk sees :data:`IO_DEPTH` of
        them even when the executor has fewer workers (one per CPU)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(IO_DEPTH, thread_name_prefix="weightplan-io")
            return self._pool

    @staticmethod
    def _request(path: str, fd: int, buffer: memoryview, offset: int, done: int,
                 end: int) -> None:
        while done < end:
            got = os.preadv(fd, [buffer[done:end]], offset + done)
            if got <= 0:
                raise TruncatedCheckpointError(
                    f"bytes {offset + done}..{offset + end} are past the end of the file "
                    "(it shrank during the load)", file=path)
            done += got

    @contextlib.contextmanager
    def window(self, path: str, offset: int, nbytes: int) -> Iterator[torch.Tensor]:
        """A ``uint8`` tensor over bytes ``[offset, offset + nbytes)`` of ``path``, mapped
        for the duration of the block (copy out of it; don't keep it)."""
        fd = self._fds[path]
        if path not in self._mappable:  # no lease: never an unguarded mapping
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            if nbytes:
                raw = memoryview(buffer.numpy()).cast("B")  # type: ignore[arg-type]  # numpy
                self._request(path, fd, raw, offset, 0, nbytes)
            yield buffer
            return
        with self._lease.mapping(path):
            if offset + nbytes > os.fstat(fd).st_size:
                raise TruncatedCheckpointError(f"bytes {offset}..{offset + nbytes} are past the "
                                               "end of the file (it shrank during the load)",
                                               file=path)
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            # private + writable: torch wants a writable buffer; nothing is ever written
            mapped = mmap.mmap(fd, nbytes + offset - start, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
            try:
                view = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes,
                                        offset=offset - start)
                yield view
                del view
            finally:
                mapped.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._lease.stop()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "Reader":
        return self

    def verify(self, when: str = "during the load") -> None:
        """Every file is still as planned (at the start, and after the last read)."""
        for path, fd in self._fds.items():
            check_unchanged(self._stamps[path], fd, when=when)

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.verify()
        finally:
            self.close()


def is_cached(fd: int, size: int) -> bool:
    """Whether a few probes across the file all find their bytes in the page cache.

    Without ``RWF_NOWAIT`` (not Linux, old kernels) every file counts as cached, which
    keeps the mapped path everywhere.
    """
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or size <= 0:
        return True
    probe = bytearray(min(_PROBE_BYTES, size))
    for i in range(_PROBES):
        at = (size - len(probe)) * i // (_PROBES - 1)
        try:
            if os.preadv(fd, [probe], at, flag) < len(probe):
                return False
        except BlockingIOError:
            return False
        except OSError:  # EOPNOTSUPP on some filesystems: can't tell, keep the mapped path
            return True
    return True


def evict(path: str | os.PathLike) -> None:
    """Drop ``path``'s pages from the page cache (``POSIX_FADV_DONTNEED``), for cold-load
    benchmarks. Dirty pages are written first, since the kernel doesn't drop them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
