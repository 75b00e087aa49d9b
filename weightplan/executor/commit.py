"""The save commit: a journal makes it atomic, whatever fails and wherever the process dies.

A save writes every new file (shards, then the index) under a hidden temporary name and
fsyncs it; nothing in the directory has changed yet. Then :func:`commit`:

1. writes the journal :data:`JOURNAL_NAME` (temp name, fsync, rename, fsync the directory):
   the list of renames (temp → final) and of the old checkpoint's files to delete;
2. applies it: renames (the index last), deletes the stale files, fsyncs the directory;
3. removes the journal and fsyncs the directory.

Before step 1 completes, the old checkpoint is intact (a failure deletes the temporaries).
After step 3, the new one is complete. In between, the journal marks the directory as an
interrupted save: every load refuses it with :class:`InterruptedSaveError`, and
:func:`recover` (``weightplan recover DIR``) completes the save from the journal, since
every new file was fsynced before the journal was written. :func:`recover` trusts no
journal blindly: it only renames hidden temporaries to plain checkpoint file names and only
deletes checkpoint files (``*.safetensors``, the index) in that directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from weightplan.errors import InterruptedSaveError, SaveError, WeightplanError
from weightplan.planner.inputs.paths import JOURNAL_NAME
from weightplan.planner.inputs.safetensors_format import strict_json

PARTIAL = ".weightplan-partial"

# Test hook: called with the name of each step ("journal", "rename model.safetensors", ...),
# so tests can fail or kill the process at every one of them. Never set in normal use.
STEP_HOOK: Callable[[str], None] | None = None


def step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def temp_name(final: str) -> str:
    return f".{final}{PARTIAL}"


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
        path = directory / JOURNAL_NAME
        data = strict_json(path.read_bytes(), file=str(path), what="save journal")
        try:
            if not isinstance(data, dict):
                raise TypeError("not an object")
            renames = tuple((str(a), str(b)) for a, b in data["renames"])
            deletes = tuple(str(d) for d in data["deletes"])
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
            if temp != temp_name(final) or not _checkpoint_name(final):
                raise InterruptedSaveError(f"the save journal asks to rename {temp!r} to "
                                           f"{final!r}, which weightplan never does",
                                           file=str(path))
        for name in self.deletes:
            if not _checkpoint_name(name) or name in finals:
                raise InterruptedSaveError(f"the save journal asks to delete {name!r}, which "
                                           "weightplan never does", file=str(path))


def _checkpoint_name(name: str) -> bool:
    plain = bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")
    return plain and name.endswith((".safetensors", ".safetensors.index.json"))


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                 0o644)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.write(fd, view[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def write_journal(directory: Path, journal: Journal) -> None:
    """Step 1: after this returns, the directory is marked as holding an unfinished commit."""
    tmp = directory / temp_name(JOURNAL_NAME.lstrip("."))
    write_synced(tmp, journal.to_bytes())
    step("journal written")
    os.replace(tmp, directory / JOURNAL_NAME)
    fsync_dir(directory)
    step("journal")


def apply(directory: Path, journal: Journal) -> None:
    """Steps 2-3 (idempotent, so :func:`recover` can run them again after a crash)."""
    for temp, final in journal.renames:
        if (directory / temp).exists():
            step(f"rename {final}")
            os.replace(directory / temp, directory / final)
        elif not (directory / final).exists():
            raise InterruptedSaveError(
                f"can't complete the interrupted save: neither {temp} nor {final} exists. The "
                "checkpoint here is incomplete: delete its files and the journal, then save "
                "again", file=str(directory))
    for name in journal.deletes:
        step(f"delete {name}")
        (directory / name).unlink(missing_ok=True)
    fsync_dir(directory)
    step("applied")
    (directory / JOURNAL_NAME).unlink()
    fsync_dir(directory)
    step("done")


def commit(directory: Path, journal: Journal, abort: Callable[[], None]) -> None:
    """Write the journal, apply it, remove it; typed errors saying what state is left.

    ``abort`` (delete the temporaries) runs when the journal could not be written: the
    directory is then unchanged. Once the journal is there, the temporaries are the new
    checkpoint's only copy and are kept for :func:`recover`.
    """
    try:
        write_journal(directory, journal)
    except BaseException as e:
        (directory / temp_name(JOURNAL_NAME.lstrip("."))).unlink(missing_ok=True)
        (directory / JOURNAL_NAME).unlink(missing_ok=True)
        abort()
        if not isinstance(e, OSError):
            raise
        raise SaveError(f"{directory}: writing the commit journal failed ({e}); nothing was "
                        "changed, the old checkpoint (if any) is intact") from e
    try:
        apply(directory, journal)
    except OSError as e:  # InterruptedSaveError included
        raise SaveError(f"{directory}: the commit failed midway ({e}). The directory is "
                        f"marked as an interrupted save ({JOURNAL_NAME}) and loads refuse it; "
                        f"run `weightplan recover {directory}` to complete the save") from e


def recover(directory: str | os.PathLike) -> str:
    """Complete a save interrupted during its commit; else remove orphaned temporaries.

    Returns:
        What was done, in words.
    """
    path = Path(directory)
    if not path.is_dir():
        raise SaveError(f"{path}: not a directory")
    if not (path / JOURNAL_NAME).exists():
        orphans = sorted(p.name for p in path.glob(f".*{PARTIAL}"))
        for name in orphans:
            (path / name).unlink(missing_ok=True)
        return (f"{path}: no interrupted save; removed {len(orphans)} orphaned temporary "
                f"file(s)" if orphans else f"{path}: no interrupted save, nothing to do")
    try:
        journal = Journal.read(path)
        apply(path, journal)
    except WeightplanError:
        raise
    except OSError as e:
        raise SaveError(f"{path}: completing the interrupted save failed: {e}") from e
    return (f"{path}: completed the interrupted save ({len(journal.renames)} file(s) in "
            f"place, {len(journal.deletes)} stale file(s) removed)")
