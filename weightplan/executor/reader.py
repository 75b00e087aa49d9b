"""Byte-range reads from checkpoint files straight into caller memory (``os.preadv``).

Files are opened once per execution and never mapped, so the page cache is the only
copy outside the destination: the process's resident memory holds what it loaded, not
the file. ``preadv`` releases the GIL, so reads on a thread pool run in parallel.
"""

from __future__ import annotations

import ctypes
import os

import torch

from weightplan.errors import CheckpointError, StaleCheckpointError, TruncatedCheckpointError
from weightplan.planner.checkpoint import Checkpoint, FileStamp

CHUNK_BYTES = 64 * 1024 * 1024


class Reader:
    """Open file descriptors for a checkpoint; checks each file is unchanged since planning."""

    def __init__(self, checkpoint: Checkpoint):
        self._fds: dict[str, int] = {}
        try:
            for stamp in checkpoint.files:
                self._open(stamp)
        except BaseException:
            self.close()
            raise

    def _open(self, stamp: FileStamp) -> None:
        try:
            now = FileStamp.of(stamp.path)
        except OSError as e:
            raise StaleCheckpointError(f"can't stat the file any more: {e}", file=stamp.path) from e
        if (now.size, now.mtime_ns) != (stamp.size, stamp.mtime_ns):
            raise StaleCheckpointError("the file changed since the plan was made; call "
                                       "explain() again", file=stamp.path)
        fd = os.open(stamp.path, os.O_RDONLY)
        self._fds[stamp.path] = fd
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def read_into(self, path: str, offset: int, address: int, nbytes: int) -> None:
        """Read ``nbytes`` at ``offset`` of ``path`` into memory at ``address``."""
        fd = self._fds[path]
        done = 0
        while done < nbytes:
            size = min(CHUNK_BYTES, nbytes - done)
            buf = (ctypes.c_char * size).from_address(address + done)
            try:
                got = os.preadv(fd, [buf], offset + done)
            except OSError as e:
                raise CheckpointError(f"read failed at byte {offset + done}: {e}", file=path) from e
            if got == 0:
                raise TruncatedCheckpointError(
                    f"file ended at byte {offset + done}, {nbytes - done} bytes short", file=path)
            done += got

    def read_tensor(self, path: str, offset: int, nbytes: int) -> torch.Tensor:
        """A new ``uint8`` tensor holding the bytes."""
        out = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            self.read_into(path, offset, out.data_ptr(), nbytes)
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
