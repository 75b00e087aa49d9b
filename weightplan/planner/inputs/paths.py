"""Paths from untrusted places: confined to the checkpoint directory, regular files only.

- :func:`check_path_argument`: a path a caller passed (no NUL byte, ``str``/``PathLike``).
- :func:`shard_path`: a shard name read from an index; it must be a relative path inside
  the index's directory (no absolute path, no ``..``, no ``.`` component, no NUL, and no
  intermediate directory resolving outside). The shard itself may be a symlink (the
  Hugging Face cache is made of them): it is followed and validated like any file.
- :func:`open_regular`: opens a file for reading only if it is a regular file (after
  following symlinks). It stats first and opens with ``O_NONBLOCK``, so a FIFO never
  blocks and a device or directory is never read.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from weightplan.errors import (
    ArgumentError, CheckpointError, InterruptedSaveError, TruncatedCheckpointError,
    UnsafePathError,
)

# written by a save just before its commit, removed when the commit is complete
JOURNAL_NAME = ".weightplan-commit.json"
ADAPTER_CONFIG = "adapter_config.json"  # the marker of a peft adapter directory

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def check_path_argument(value: object, *, what: str = "checkpoint") -> str:
    """``value`` as a ``str`` path; :class:`ArgumentError` for bytes, NUL bytes, other types."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise ArgumentError(f"{what} was given as {type(value).__name__}; pass a str or "
                            "pathlib.Path (decode the bytes first)")
    try:
        path = os.fspath(value)  # type: ignore[call-overload]  # TypeError handled below
    except TypeError as e:
        raise ArgumentError(f"{what} must be a path (str or os.PathLike), got "
                            f"{type(value).__name__}") from e
    if not isinstance(path, str):
        raise ArgumentError(f"{what} path must be text, got {type(path).__name__}")
    if "\x00" in path:
        raise ArgumentError(f"{what} path {path!r} contains a NUL byte")
    return path


def shard_path(index: Path, name: object) -> Path:
    """The file ``name`` (from ``index``) inside ``index``'s directory, or UnsafePathError."""
    where = str(index)
    if not isinstance(name, str) or not name:
        raise UnsafePathError(f"the index names a shard {name!r}, which is not a file name",
                              file=where)
    reason = _unsafe_reason(name)
    if reason:
        raise UnsafePathError(f"the index names shard {name!r}, {reason}; weightplan only "
                              "opens files inside the checkpoint directory", file=where)
    path = index.parent / name
    if len(PurePosixPath(name).parts) > 1:
        root = os.path.realpath(index.parent)
        parent = os.path.realpath(path.parent)
        if os.path.commonpath([root, parent]) != root:
            raise UnsafePathError(f"the index names shard {name!r}, whose directory resolves "
                                  f"outside the checkpoint directory ({parent})", file=where)
    return path


def _unsafe_reason(name: str) -> str | None:
    if "\x00" in name:
        return "which contains a NUL byte"
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive:
        return "an absolute path"
    parts = name.replace("\\", "/").split("/")
    if any(p in ("..", ".", "") for p in parts):
        return "a path with '..', '.' or empty components"
    return None


def special_kind(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO (named pipe)", ...), ``None`` for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: str) -> int:
    """A read-only file descriptor for ``path`` if it is a regular file (symlinks followed).

    Raises:
        UnsafePathError: a directory, FIFO, device or socket (never opened, or opened
            non-blocking and closed at once).
        CheckpointError: it doesn't exist or can't be opened (the OS reason).
    """
    try:
        _refuse_special(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except CheckpointError:
        raise
    except FileNotFoundError as e:
        raise CheckpointError("file not found", file=path) from e
    except (OSError, ValueError) as e:
        raise CheckpointError(f"can't open: {e}", file=path) from e
    try:
        _refuse_special(path, os.fstat(fd).st_mode)  # it may have been swapped since stat
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_special(path: str, mode: int) -> None:
    kind = special_kind(mode)
    if kind is not None:
        raise UnsafePathError(f"is {kind}, not a regular file; weightplan reads checkpoints "
                              "only from regular files (symlinks to them are fine)", file=path)


def refuse_interrupted_save(directory: Path, then: str = "load") -> None:
    """:class:`InterruptedSaveError` if ``directory`` holds a save stopped during its commit
    (the way out: ``recover`` it, then ``then`` again)."""
    try:
        present = (directory / JOURNAL_NAME).exists()
    except (OSError, ValueError):
        return  # the path itself is unusable: opening it says why
    if present:
        raise InterruptedSaveError(
            f"this directory holds a save that was interrupted during its commit (the "
            f"journal {JOURNAL_NAME} is still there), so its files may be a mix of two "
            f"checkpoints. Run `weightplan recover {shlex.quote(str(directory))}` (or "
            f"weightplan.executor.commit.recover({str(directory)!r})) to complete that save, "
            f"then {then} again", file=str(directory))


def pread_exactly(fd: int, n: int, offset: int, path: str) -> bytes:
    """``n`` bytes of the open file ``fd`` from ``offset``; :class:`TruncatedCheckpointError`
    when the file ends first."""
    parts, done = [], 0
    while done < n:
        chunk = os.pread(fd, min(n - done, 1 << 24), offset + done)
        if not chunk:
            raise TruncatedCheckpointError(f"the header ends after {done} of its {n} bytes",
                                           file=path)
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def is_adapter_dir(path: object) -> bool:
    """Whether ``path`` is a directory holding an ``adapter_config.json`` (the marker; the
    adapter modules are imported only then)."""
    return isinstance(path, (str, os.PathLike)) and os.path.isfile(
        os.path.join(os.fspath(path), ADAPTER_CONFIG))
