"""One writer per directory: the lock a save holds from its first temporary to the end of
its commit, and ``recover`` while it works.

Two saves into one directory would otherwise race on its files, and ``recover`` would
delete a running save's temporaries as orphans. The lock is an exclusive ``flock`` on
:data:`LOCK_NAME` in the directory (per open file, so two threads of one process exclude
each other too; released by the kernel when the holder dies, even by ``kill -9``). The
holder writes who it is into the file, so that the refused one can name it. The file is
opened without following a symlink and must be a regular file; the holder removes it when
done (after checking that the name still points at the file it locked, so a third
process can't slip in between an unlink and a lock).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from weightplan.errors import ConcurrentSaveError, SaveError

LOCK_NAME = ".weightplan-lock"
_FLAGS = (os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
          | getattr(os, "O_CLOEXEC", 0))
_TRIES = 8  # a lock file removed under us by its holder: open it again (a few times)


class DirectoryLock:
    """The writer's lock on ``directory``; ``what`` ("save", "recover") names the holder."""

    def __init__(self, directory: Path, what: str):
        self.path = directory / LOCK_NAME
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or :class:`ConcurrentSaveError` naming who holds it."""
        for _ in range(_TRIES):
            fd = self._open()
            try:
                if self._lock(fd):
                    self._fd = fd
                    self._describe(fd)
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the holder removed the file as we opened it: a fresh one
        raise ConcurrentSaveError(f"{self.path.parent}: the lock file {LOCK_NAME} keeps being "
                                  "replaced; another process is saving into this directory")

    def _open(self) -> int:
        try:
            fd = os.open(self.path, _FLAGS, 0o644)
        except OSError as e:
            link = os.path.islink(self.path)
            what = "is a symbolic link, which weightplan never creates" if link else str(e)
            raise SaveError(f"{self.path}: can't open the directory's lock file ({what}); "
                            "remove it if no weightplan save is running, then try again") from e
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise SaveError(f"{self.path}: the directory's lock file is not a regular file; "
                            "remove it if no weightplan save is running, then try again")
        return fd

    def _lock(self, fd: int) -> bool:
        """True once ``fd`` is locked and is still the file at the lock's name."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            raise ConcurrentSaveError(
                f"{self.path.parent}: another weightplan {holder or 'save or recover'} is "
                f"writing this directory (it holds {LOCK_NAME}); wait for it to finish, or "
                f"stop it, then {self.what} again") from None
        try:
            return os.lstat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _describe(self, fd: int) -> None:
        since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        text = f"{self.what} (pid {os.getpid()} on {socket.gethostname()}, since {since})"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)

    def release(self) -> None:
        """Remove the lock file and unlock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # still ours: nobody else can lock it while we hold it
        os.close(fd)


@contextlib.contextmanager
def directory_lock(directory: Path, what: str) -> Iterator[None]:
    """Hold ``directory``'s writer lock for the block."""
    lock = DirectoryLock(directory, what)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
