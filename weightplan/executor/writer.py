"""The file sink: a streaming, atomic safetensors writer for a planned shard layout.

It follows the :class:`~weightplan.executor.sink.Sink` protocol.

Every shard is written under a temporary name in the target directory: header first,
then each tensor's bytes at its planned offset as steps complete (``pwrite``, straight
from the source tensor's memory when the copy is direct). Only when every step succeeded
are the shards and the index fsync'ed and committed through a journal
(:mod:`weightplan.executor.commit`): renamed into place, the index last, and stale files
of an overwritten checkpoint removed. A failure before the commit deletes the
temporaries; a failure or a kill during it leaves the directory marked as an interrupted
save, which loads refuse and ``weightplan recover DIR`` completes. Never a mix.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from weightplan.errors import SaveError
from weightplan.executor.commit import (
    PARTIAL, Journal, commit, step, temp_name, write_synced,
)
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


class FileSink:
    """Writes destinations of kind FILE into the shards of ``layout`` under ``directory``."""

    def __init__(self, directory: str, layout: ShardLayout, overwrite: bool):
        self.directory, self.layout, self.overwrite = Path(directory), layout, overwrite
        self._fds: dict[str, int] = {}
        self._partial: dict[str, Path] = {}
        refuse_interrupted_save(self.directory)
        taken = [n for n in layout.names if (self.directory / n).exists()]
        if taken and not overwrite:
            raise SaveError(f"{self.directory} now holds {', '.join(taken)}; pass overwrite=True "
                            "to replace it")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for shard in layout.files:
                self._create(shard.name, shard.header, shard.size)
            step("created")
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError) and not isinstance(e, SaveError):
                raise SaveError(f"{self.directory}: can't create the output files: {e}") from e
            raise

    def _create(self, name: str, header: bytes, size: int) -> None:
        path = self.directory / temp_name(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fds[name], self._partial[name] = fd, path
        os.ftruncate(fd, size)
        _pwrite_all(fd, torch.frombuffer(bytearray(header), dtype=torch.uint8), 0, str(path))

    def open(self, dest: Destination) -> torch.Tensor | None:
        return torch.empty(dest.spec.shape, dtype=dest.spec.dtype) if dest.staged else None

    def byte_view(self, handle: torch.Tensor | None, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        return None  # bytes go to the file with pwrite, never through a CPU view

    def write_bytes(self, handle: torch.Tensor | None, dest: Destination, offset: int,
                    data: torch.Tensor) -> None:
        name, base = self.layout.locations[dest.key]
        _pwrite_all(self._fds[name], data.contiguous(), base + offset, str(self._partial[name]))

    def write_view(self, handle: torch.Tensor, dest: Destination, view: View,
                   src: torch.Tensor) -> None:
        with torch.no_grad():
            strided(handle, view).copy_(src.reshape(view.shape))

    def close(self, dest: Destination, handle: torch.Tensor | None) -> None:
        if handle is not None:
            self.write_bytes(None, dest, 0, flat_bytes(handle))

    def commit(self) -> None:
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
            raise SaveError(f"{self.directory}: flushing the new files failed ({e}); nothing "
                            "was changed") from e
        commit(self.directory, journal, self.abort)
        self._partial.clear()

    def _journal(self) -> Journal:
        """Write the index under its temporary name; the renames and deletes to commit."""
        finals = list(self.layout.names)
        if self.layout.index is not None:
            tmp = self.directory / temp_name(INDEX_NAME)
            self._partial[INDEX_NAME] = tmp
            write_synced(tmp, self.layout.index)
            step("index synced")
            finals.append(INDEX_NAME)
        renames = tuple((temp_name(n), n) for n in finals)
        return Journal(renames, tuple(sorted(self._old_files() - set(finals))))

    def _old_files(self) -> set[str]:
        """Checkpoint files an overwrite replaces: the old index, its shards, the single file."""
        old = {p.name for p in self.directory.glob("*.safetensors")}
        old = {n for n in old if n == SINGLE_NAME or n.startswith("model-")}
        return old | ({INDEX_NAME} if (self.directory / INDEX_NAME).exists() else set())

    def abort(self) -> None:
        self._close_all()
        for path in self._partial.values():
            path.unlink(missing_ok=True)
        self._partial.clear()

    def _close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
