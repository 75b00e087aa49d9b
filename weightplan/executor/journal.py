"""The commit journal: what a save's commit renames and deletes, and the names it may use.

A save's files are written under hidden temporary names that no one can predict
(:func:`temp_name` with a per-save random token) and created exclusively, never through
an existing file or symlink (:func:`create_exclusive`). The journal lists the renames
(temporary → final) and the old checkpoint's files to delete. It is read back by
``recover`` like any untrusted file: a regular file (no FIFO, device or link to one), at
most :data:`MAX_JOURNAL_BYTES`, strict JSON, and it may only rename this save's hidden
temporaries to plain checkpoint names and delete checkpoint files; anything else is an
:class:`InterruptedSaveError` that says what to do.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from weightplan.errors import CheckpointError, InterruptedSaveError, SaveError
from weightplan.planner.inputs.paths import JOURNAL_NAME, open_regular, pread_exactly
from weightplan.planner.inputs.safetensors_format import strict_json

PARTIAL = ".weightplan-partial"
MAX_JOURNAL_BYTES = 64 * 1024 * 1024  # a million shards' renames fit in a tenth of it
CONFIG_NAMES = ("config.json", "generation_config.json")  # renamed in with the shards
_TOKEN = "[0-9a-f]{16}"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def new_token() -> str:
    """A save's random token: its temporaries' names can't be guessed or planted."""
    return secrets.token_hex(8)


def temp_name(final: str, token: str) -> str:
    return f".{final}.{token}{PARTIAL}"


def create_exclusive(path: Path) -> int:
    """A new file at ``path`` for writing: never an existing file, never through a symlink.

    Raises:
        SaveError: something is at ``path`` already (planted, or another save's).
    """
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
             | getattr(os, "O_CLOEXEC", 0))
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError as e:
        raise SaveError(f"{path}: a file or link is already there, where this save's "
                        "temporary goes; refusing to write through it (nothing was changed)"
                        ) from e


def write_synced(path: Path, data: bytes) -> None:
    """Create ``path`` exclusively with ``data``, fsynced; on failure nothing is left."""
    fd = create_exclusive(path)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.write(fd, view[done:])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


@dataclass(frozen=True)
class Journal:
    """What a commit does: ``renames`` (temp, final) in order, then ``deletes``."""

    renames: tuple[tuple[str, str], ...]
    deletes: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"weightplan_commit": 1, "renames": [list(r) for r in self.renames],
                           "deletes": list(self.deletes)}, indent=1).encode()

    @classmethod
    def read(cls, directory: Path) -> "Journal":
        """The directory's journal, read like an untrusted checkpoint file and checked."""
        path = directory / JOURNAL_NAME
        data = strict_json(_read_guarded(path), file=str(path), what="save journal")
        try:
            if not isinstance(data, dict):
                raise TypeError("not an object")
            renames = tuple((_text(a), _text(b)) for a, b in data["renames"])
            deletes = tuple(_text(d) for d in data["deletes"])
        except (TypeError, KeyError, ValueError) as e:
            raise InterruptedSaveError(f"the save journal is unreadable ({e}); delete the "
                                       "checkpoint files and the journal, then save again",
                                       file=str(path)) from e
        journal = cls(renames, deletes)
        journal.check(path)
        return journal

    def check(self, path: Path) -> None:
        """Only hidden temporaries → plain checkpoint names; only checkpoint files deleted."""
        finals = {final for _, final in self.renames}
        for temp, final in self.renames:
            if not (_saved_name(final) and is_temp_of(temp, final)):
                raise InterruptedSaveError(f"the save journal asks to rename {temp!r} to "
                                           f"{final!r}, which weightplan never does",
                                           file=str(path))
        for name in self.deletes:
            if not _checkpoint_name(name) or name in finals:
                raise InterruptedSaveError(f"the save journal asks to delete {name!r}, which "
                                           "weightplan never does", file=str(path))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a file name")
    return value


def _read_guarded(path: Path) -> bytes:
    try:
        fd = open_regular(str(path))
    except CheckpointError as e:
        raise InterruptedSaveError(f"the save journal can't be read ({e}); weightplan never "
                                   f"writes such a journal: check the directory, remove "
                                   f"{JOURNAL_NAME} and load or save again", file=str(path)
                                   ) from e
    try:
        size = os.fstat(fd).st_size
        if size > MAX_JOURNAL_BYTES:
            raise InterruptedSaveError(f"the save journal is {size} bytes, more than any save "
                                       f"writes ({MAX_JOURNAL_BYTES}); it is not weightplan's: "
                                       f"check the directory and remove {JOURNAL_NAME}",
                                       file=str(path))
        return pread_exactly(fd, size, 0, str(path))
    except OSError as e:
        if isinstance(e, CheckpointError):
            raise
        raise InterruptedSaveError(f"the save journal can't be read ({e})", file=str(path)
                                   ) from e
    finally:
        os.close(fd)


def is_temp_of(temp: str, final: str) -> bool:
    """Whether ``temp`` is a save's temporary name for ``final`` (any token)."""
    if temp == f".{final}{PARTIAL}":  # the names of saves before per-save tokens
        return True
    return re.fullmatch(re.escape(f".{final}.") + _TOKEN + re.escape(PARTIAL), temp) is not None


def _plain(name: str) -> bool:
    return (bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
            and _CONTROL.search(name) is None)


def _checkpoint_name(name: str) -> bool:
    return _plain(name) and name.endswith((".safetensors", ".safetensors.index.json"))


def _saved_name(name: str) -> bool:
    """A name a save writes: a checkpoint file or the model's config."""
    return _checkpoint_name(name) or name in CONFIG_NAMES
