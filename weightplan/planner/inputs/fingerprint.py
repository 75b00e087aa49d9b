"""A checkpoint file's identity at plan time, checked again before and after execution.

Size and mtime alone miss a file rewritten with the same size and its mtime set back
(``os.utime``): its old offsets would then read one tensor's bytes into another. A
:class:`FileStamp` also holds the inode, the device, the ctime (which no user can set
back) and a SHA-256 of the header itself (the 8-byte length and the JSON), so a changed
header is caught even where the filesystem's timestamps are coarse.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

from weightplan.errors import StaleCheckpointError

_HEADER_CAP = 100 * 1024 * 1024 + 8


@dataclass(frozen=True, slots=True)
class FileStamp:
    """Identity of a file at plan time, checked again before and after execution."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int = 0
    inode: int = 0
    device: int = 0
    header_sha256: str = ""
    data_start: int = 0  # first byte of the data section (after the 8-byte length and header)

    @classmethod
    def of(cls, path: str) -> "FileStamp":
        """Stamp the file at ``path`` now (stat, then hash its header)."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            return stamp_fd(path, fd)
        finally:
            os.close(fd)

    def differences(self, other: "FileStamp") -> list[str]:
        """What differs between two stamps of one file, in words (empty: unchanged)."""
        fields = (("size", "size"), ("mtime_ns", "modification time"),
                  ("ctime_ns", "change time"), ("inode", "inode (the file was replaced)"),
                  ("device", "device"), ("header_sha256", "header bytes"))
        return [words for name, words in fields
                if getattr(self, name) != getattr(other, name)]


def header_digest(fd: int, size: int) -> tuple[str, int]:
    """SHA-256 of the header (length prefix and JSON) of the open file ``fd``, and the
    first byte of its data section."""
    head = os.pread(fd, 8, 0) if size >= 8 else b""
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
    body = os.pread(fd, min(n, _HEADER_CAP, max(size - 8, 0)), 8) if n else b""
    return hashlib.sha256(head + body).hexdigest(), 8 + n


def stamp_fd(path: str, fd: int, header: tuple[bytes, bytes] | None = None) -> FileStamp:
    """Stamp an open file (``fstat`` and its header's digest). ``header``: the 8-byte
    length and the JSON just read from ``fd`` by a caller that checked the length against
    the file, hashed as they are instead of read again."""
    st = os.fstat(fd)
    if header is None:
        digest, data_start = header_digest(fd, st.st_size)
    else:
        length, body = header
        sha = hashlib.sha256(length)
        sha.update(body)
        digest, data_start = sha.hexdigest(), len(length) + len(body)
    return FileStamp(path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                     digest, data_start)


def check_unchanged(stamp: FileStamp, fd: int, *, when: str = "since the plan was made"
                    ) -> None:
    """Raise :class:`StaleCheckpointError` if the open file ``fd`` is not what ``stamp`` saw."""
    try:
        now = stamp_fd(stamp.path, fd)
    except OSError as e:
        raise StaleCheckpointError(f"can't read the file any more: {e}", file=stamp.path) from e
    changed = stamp.differences(now)
    if changed:
        raise StaleCheckpointError(
            f"the file changed {when} ({', '.join(changed)} differ); nothing planned from its "
            "old header is used. Call explain() again", file=stamp.path)
