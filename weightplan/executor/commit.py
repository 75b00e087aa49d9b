"""The save commit: a journal makes it atomic, whatever fails and wherever the process dies.

A save holds the directory's lock (:mod:`~weightplan.executor.dir_lock`) from its first
temporary to the end of its commit. It writes every new file (shards, the model's config,
then the index) under a hidden temporary name of its own (a random token in it, created
exclusively, never through an existing file or symlink: :mod:`~weightplan.executor.journal`)
and fsyncs it; nothing in the directory has changed yet. Then :func:`commit`:

1. writes the journal :data:`JOURNAL_NAME` (temp name, fsync, rename, fsync the directory):
   the list of renames (temp → final) and of the old checkpoint's files to delete;
2. applies it: renames (the index last), deletes the stale files, fsyncs the directory;
3. removes the journal and fsyncs the directory.

Before step 1 completes, the old checkpoint is intact (a failure deletes the temporaries).
After step 3, the new one is complete. In between, the journal marks the directory as an
interrupted save: every load refuses it with :class:`InterruptedSaveError`, and
:func:`recover` (``weightplan recover DIR``) completes the save from the journal, since
every new file was fsynced before the journal was written. :func:`recover` trusts no
journal blindly: it reads it like an untrusted file, only renames hidden temporaries to
plain checkpoint file names (and the model's config) and only deletes checkpoint files
(``*.safetensors``, the index) in that directory, and holds the lock while it works.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from weightplan.errors import (CheckpointError, InterruptedSaveError, SaveError,
                               WeightplanError)
from weightplan.executor.dir_lock import directory_lock
from weightplan.executor.journal import (
    PARTIAL, Journal, create_exclusive, new_token, temp_name, write_synced,
)
from weightplan.planner.inputs.paths import JOURNAL_NAME
from weightplan.units import counted

__all__ = ["PARTIAL", "Journal", "commit", "create_exclusive", "new_token", "recover",
           "refuse_directories", "step", "temp_name", "write_synced"]

# Test hook: called with the name of each step ("journal", "rename model.safetensors", ...),
# so tests can fail or kill the process at every one of them. Never set in normal use.
STEP_HOOK: Callable[[str], None] | None = None


def step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def refuse_directories(directory: Path, names: Iterable[str]) -> None:
    """:class:`SaveError` when one of ``names`` is a directory, which no rename or delete
    of the commit could replace: refused before anything changes."""
    for name in names:
        try:
            mode = os.lstat(directory / name).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            raise SaveError(f"{directory / name} is a directory, where the save puts (or "
                            "removes) a checkpoint file; move it away and save again. Nothing "
                            "was changed")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_journal(directory: Path, journal: Journal, token: str) -> None:
    """Step 1: after this returns, the directory is marked as holding an unfinished commit."""
    tmp = directory / temp_name(JOURNAL_NAME.lstrip("."), token)
    write_synced(tmp, journal.to_bytes())
    step("journal written")
    os.replace(tmp, directory / JOURNAL_NAME)
    fsync_dir(directory)
    step("journal")


def apply(directory: Path, journal: Journal) -> None:
    """Steps 2-3 (idempotent, so :func:`recover` can run them again after a crash)."""
    _refuse_blocked(directory, journal)
    for temp, final in journal.renames:
        if os.path.lexists(directory / temp):
            step(f"rename {final}")
            os.replace(directory / temp, directory / final)
        elif not os.path.lexists(directory / final):
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


def _refuse_blocked(directory: Path, journal: Journal) -> None:
    """A directory where the journal renames or deletes a file: say so before any change."""
    names = [final for _, final in journal.renames] + list(journal.deletes)
    try:
        refuse_directories(directory, names)
    except SaveError as e:
        raise InterruptedSaveError(f"{e}; then run `weightplan recover {directory}` to "
                                   "complete the interrupted save", file=str(directory)) from e


def commit(directory: Path, journal: Journal, abort: Callable[[], None], token: str) -> None:
    """Write the journal, apply it, remove it; typed errors saying what state is left.

    ``abort`` (delete the temporaries) runs when the journal could not be written: the
    directory is then unchanged. Once the journal is there, the temporaries are the new
    checkpoint's only copy and are kept for :func:`recover`. The caller holds the
    directory's lock (:mod:`~weightplan.executor.dir_lock`) throughout.
    """
    try:
        write_journal(directory, journal, token)
    except BaseException as e:
        (directory / temp_name(JOURNAL_NAME.lstrip("."), token)).unlink(missing_ok=True)
        (directory / JOURNAL_NAME).unlink(missing_ok=True)
        abort()
        if not isinstance(e, OSError) or isinstance(e, SaveError):
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

    Holds the directory's lock while it works: a save running in the directory makes it
    fail with :class:`ConcurrentSaveError` naming that save, and nothing is touched.

    Returns:
        What was done, in words.
    """
    path = Path(directory)
    if not path.is_dir():  # (as a load of it says: a checkpoint path that isn't there)
        what = "not a directory" if path.exists() else "no such directory"
        raise CheckpointError(f"{what}; recover takes the directory a save was writing",
                              file=str(path))
    with directory_lock(path, "recover"):
        if not os.path.lexists(path / JOURNAL_NAME):
            orphans = remove_orphans(path)
            return (f"{path}: no interrupted save; removed "
                    f"{counted(orphans, 'orphaned temporary file')}" if orphans
                    else f"{path}: no interrupted save, nothing to do")
        try:
            journal = Journal.read(path)
            apply(path, journal)
        except WeightplanError:
            raise
        except OSError as e:
            raise SaveError(f"{path}: completing the interrupted save failed: {e}") from e
    return (f"{path}: completed the interrupted save ({counted(len(journal.renames), 'file')} "
            f"in place, {counted(len(journal.deletes), 'stale file')} removed)")


def remove_orphans(path: Path, files_only: bool = False) -> int:
    """Temporaries no save is writing (the caller holds the lock: ``recover``, or a save
    before it creates its own, after one killed before its commit); never a directory,
    with ``files_only`` only regular files (what a save creates: a link planted at a
    temporary's name is left, for the save to fail closed on)."""
    removed = 0
    for orphan in sorted(path.glob(f".*{PARTIAL}")):
        try:
            mode = os.lstat(orphan).st_mode
            if stat.S_ISDIR(mode) or (files_only and not stat.S_ISREG(mode)):
                continue
            orphan.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise SaveError(f"{orphan}: can't remove this orphaned temporary: {e}") from e
        removed += 1
    return removed
