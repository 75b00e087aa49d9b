"""The file sink: a streaming, atomic safetensors writer for a planned shard layout.

It follows the :class:`~weightplan.executor.sink.Sink` protocol.

It holds the directory's lock from its first temporary to the end of the commit (a second
save or ``recover`` is refused, naming it). Every shard is written under a temporary name
of this save's own in the target directory, created exclusively (never through a planted
file or symlink): header first, then each tensor's bytes at its planned offset as steps
complete (``pwrite``, straight from the source tensor's memory when the copy is direct).
Only when every step succeeded are the shards, the model's config files (``files``) and
the index fsync'ed and committed through a journal (:mod:`weightplan.executor.commit`):
renamed into place, the index last, and stale files of an overwritten checkpoint
removed. A failure before the commit deletes the temporaries; a failure or a kill during
it leaves the directory marked as an interrupted save, which loads refuse and
``weightplan recover DIR`` completes. Never a mix.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from weightplan.errors import ExecutionError, SaveError, WeightplanError
from weightplan.executor.commit import (
    PARTIAL, Journal, commit, create_exclusive, new_token, refuse_directories, remove_orphans,
    step, temp_name, write_synced,
)
from weightplan.executor.dir_lock import DirectoryLock
from weightplan.executor.fd_limit import limit_hint, out_of_descriptors
from weightplan.executor.model_sink import flat_bytes, strided
from weightplan.planner.inputs.paths import refuse_interrupted_save
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View
from weightplan.planner.write.shards import INDEX_NAME, SINGLE_NAME, ShardLayout

__all__ = ["FileSink", "PARTIAL"]


def _pwrite_all(fd: int, data: torch.Tensor, offset: int, path: str) -> None:
    nbytes = data.numel()
    done = 0
    while done < nbytes:
        buf = (ctypes.c_char * (nbytes - done)).from_address(data.data_ptr() + done)
        try:
            done += os.pwrite(fd, buf, offset + done)
        except OSError as e:
            raise SaveError(f"{path}: write failed at byte {offset + done}: {e}") from e


def _anonymous(shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """A staged output's memory, mapped for it alone: unmapped (given back to the system)
    as soon as it is written and dropped. From the allocator, the freed outputs stayed in
    glibc's arenas (its mmap threshold rises to the largest block freed): a dequantizing
    convert of a 416 MiB int4 copy under a 64 MiB budget grew the RSS by 138-176 MiB,
    with these 106 MiB (41 MiB of it importing ``torch.distributed.tensor``: see
    ``gather.has_dtensors``; 62.5-66 MiB without it)."""
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8, count=nbytes)
    return raw.view(dtype).view(shape)


def _missing(directory: Path) -> list[Path]:
    """``directory`` and its ancestors that don't exist yet, deepest first: what a write
    creates, and a failed one removes so that it leaves no trace."""
    missing = []
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    return missing


class FileSink:
    """Writes destinations of kind FILE into the shards of ``layout`` under ``directory``;
    ``files`` (``{"config.json": bytes}``) are committed with them."""

    def __init__(self, directory: str, layout: ShardLayout, overwrite: bool,
                 files: Mapping[str, bytes] | None = None):
        self.directory, self.layout, self.overwrite = Path(directory), layout, overwrite
        self.files = dict(files or {})
        self._token = new_token()
        self._fds: dict[str, int] = {}
        self._partial: dict[str, Path] = {}
        self._lock = DirectoryLock(self.directory, "save")
        self._created = _missing(self.directory)  # removed again by a failed write
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
            self._refuse_taken()
            for shard in layout.files:
                self._create(shard.name, shard.header, shard.size)
            step("created")
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError) and not isinstance(e, WeightplanError):
                why = (limit_hint(e, len(layout.files), "the save") if out_of_descriptors(e)
                       else str(e))
                raise SaveError(f"{self.directory}: can't create the output files: {why}"
                                ) from e
            raise

    def _refuse_taken(self) -> None:
        """Under the lock: no interrupted save here, no checkpoint unless ``overwrite``, no
        directory where a file goes; the temporaries of a save killed before its commit
        removed (no save is writing them: we hold the lock, and have made none yet)."""
        refuse_interrupted_save(self.directory, then="save")
        taken = [n for n in self.layout.names if (self.directory / n).exists()]
        if taken and not self.overwrite:
            raise SaveError(f"{self.directory} now holds {', '.join(taken)}; pass "
                            "overwrite=True to replace it")
        refuse_directories(self.directory, self._finals() + sorted(self._old_files()))
        remove_orphans(self.directory, files_only=True)

    def _finals(self) -> list[str]:
        index = [INDEX_NAME] if self.layout.index is not None else []
        return [f.name for f in self.layout.files] + sorted(self.files) + index

    def _create(self, name: str, header: bytes, size: int) -> None:
        path = self.directory / temp_name(name, self._token)
        fd = create_exclusive(path)
        self._fds[name], self._partial[name] = fd, path
        os.ftruncate(fd, size)
        _pwrite_all(fd, torch.frombuffer(bytearray(header), dtype=torch.uint8), 0, str(path))

    def open(self, dest: Destination) -> torch.Tensor | None:
        return _anonymous(dest.spec.shape, dest.spec.dtype, dest.spec.nbytes) if dest.staged else None

    def byte_view(self, handle: torch.Tensor | None, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        return None  # bytes go to the file with pwrite, never through a CPU view

    def file_region(self, handle: torch.Tensor | None, dest: Destination, offset: int
                    ) -> tuple[int, int, str] | None:
        """A tensor written straight to its shard (not staged): where byte ``offset`` goes."""
        if handle is not None:
            return None
        name, base = self.layout.locations[dest.key]
        return self._fds[name], base + offset, str(self._partial[name])

    def write_bytes(self, handle: torch.Tensor | None, dest: Destination, offset: int,
                    data: torch.Tensor) -> None:
        name, base = self.layout.locations[dest.key]
        _pwrite_all(self._fds[name], data.contiguous(), base + offset, str(self._partial[name]))

    def write_view(self, handle: torch.Tensor, dest: Destination, view: View,
                   src: torch.Tensor) -> None:
        with torch.no_grad():
            strided(handle, view).copy_(src.reshape(view.shape))

    def update_view(self, handle: torch.Tensor | None, dest: Destination,
                    view: View) -> torch.Tensor:
        if handle is None:  # (lowering updates no file destination in place)
            raise ExecutionError(f"{dest.key} goes straight to its file: nothing to update "
                                 "in place; explain the save again")
        return strided(handle, view)

    def close(self, dest: Destination, handle: torch.Tensor | None) -> None:
        if handle is not None:
            self.write_bytes(None, dest, 0, flat_bytes(handle))

    def commit(self) -> None:
        try:
            try:
                for fd in self._fds.values():
                    os.fsync(fd)
                self._close_all()
                step("shards synced")
                journal = self._journal()
            except BaseException as e:
                self.abort()
                if not isinstance(e, OSError) or isinstance(e, SaveError):
                    raise
                raise SaveError(f"{self.directory}: flushing the new files failed ({e}); "
                                "nothing was changed") from e
            commit(self.directory, journal, self.abort, self._token)
            self._partial.clear()
        finally:
            self._lock.release()

    def _journal(self) -> Journal:
        """Write the config files and the index under their temporary names; the renames
        (the index last) and deletes to commit."""
        for name, data in [*sorted(self.files.items()), (INDEX_NAME, self.layout.index)]:
            if data is None:
                continue
            tmp = self.directory / temp_name(name, self._token)
            write_synced(tmp, data)
            self._partial[name] = tmp
            step("index synced" if name == INDEX_NAME else f"{name} synced")
        finals = self._finals()
        refuse_directories(self.directory, finals + sorted(self._old_files()))
        renames = tuple((temp_name(n, self._token), n) for n in finals)
        for temp, _ in renames:  # the journal would skip a missing one: the old file stays
            if not os.path.isfile(self.directory / temp):
                raise SaveError(f"{self.directory / temp}: this save's temporary vanished (did "
                                "another process remove it?); nothing was changed")
        return Journal(renames, tuple(sorted(self._old_files() - set(finals))))

    def _old_files(self) -> set[str]:
        """Checkpoint files an overwrite replaces: the old index, its shards, the single file."""
        old = {p.name for p in self.directory.glob("*.safetensors")}
        old = {n for n in old if n == SINGLE_NAME or n.startswith("model-")}
        return old | ({INDEX_NAME} if os.path.lexists(self.directory / INDEX_NAME) else set())

    def abort(self) -> None:
        self._close_all()
        for path in self._partial.values():
            path.unlink(missing_ok=True)
        self._partial.clear()
        self._lock.release()
        for directory in self._created:  # (deepest first; one holding anything stays)
            with contextlib.suppress(OSError):
                directory.rmdir()
        self._created = []

    def _close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
