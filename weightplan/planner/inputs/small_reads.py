"""Small integer tensors read at plan time (``weight_shape``'s 2–3 values, a per-tensor
scale's raw bytes): a batch at a time, each file's in runs of nearby tensors, one
``pread`` a run.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence

import torch

from weightplan.planner.core.entry import TensorEntry

INTEGER_CODES = {torch.int64: "q", torch.int32: "i", torch.int16: "h", torch.int8: "b",
           torch.uint8: "B"}


class SmallReader:
    """Reads tiny integer tensors (``weight_shape``: 2–3 values) at plan time, from the
    in-memory dict or their files' bytes: a batch at a time, each file's in runs of
    tensors at most :data:`_GAP` bytes apart, one ``pread`` a run (safetensors writes the
    I64 tensors first, side by side: Kimi-K2's ~1.1k a file are one read)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None) -> None:
        self.tensors = tensors
        self.handles: dict[str, int] = {}  # file → descriptor

    def __call__(self, entries: Sequence[TensorEntry]) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = [()] * len(entries)
        by_file: dict[str | None, list[int]] = {}
        for i, entry in enumerate(entries):
            if entry.spec.dtype not in INTEGER_CODES:
                from weightplan.errors import QuantizationError
                raise QuantizationError(f"{entry.key} is not an integer tensor ({entry.spec})",
                                        file=entry.file, key=entry.key)
            by_file.setdefault(entry.file, []).append(i)
        for file, at in by_file.items():
            if file is None:
                assert self.tensors is not None
                for i in at:
                    out[i] = tuple(int(v) for v in self.tensors[entries[i].key].reshape(-1).tolist())
                continue
            at.sort(key=lambda i: entries[i].offset)
            for run in _runs(entries, at):
                self._read_run(file, entries, run, out)
        return out

    def _read_run(self, file: str, entries: Sequence[TensorEntry], run: list[int],
                  out: list[tuple[int, ...]]) -> None:
        fd = self.handles.get(file)
        if fd is None:
            fd = self.handles[file] = os.open(file, os.O_RDONLY)
        start = entries[run[0]].offset
        data = os.pread(fd, run[-1] - start, start)  # (the run's end: see _runs)
        formats: dict[int, tuple[str, int]] = {}  # by id(spec): the specs are shared
        for i in run[:-1]:
            entry = entries[i]
            code, size = formats.get(id(entry.spec)) or formats.setdefault(id(entry.spec), (
                f"<{entry.spec.numel}{INTEGER_CODES[entry.spec.dtype]}", entry.nbytes))
            at = entry.offset - start
            if at + size > len(data):
                from weightplan.errors import QuantizationError
                raise QuantizationError(f"{entry.key} is cut short ({entry.spec})",
                                        file=entry.file, key=entry.key)
            out[i] = struct.unpack_from(code, data, at)

    def raw(self, entry: TensorEntry) -> bytes:
        """A small tensor's bytes as stored (a per-tensor scale's 4: compared bit for bit)."""
        if entry.file is None:
            assert self.tensors is not None
            t = self.tensors[entry.key].detach().contiguous().reshape(-1)
            return t.view(torch.uint8).numpy().tobytes()
        fd = self.handles.get(entry.file)
        if fd is None:
            fd = self.handles[entry.file] = os.open(entry.file, os.O_RDONLY)
        data = os.pread(fd, entry.nbytes, entry.offset)
        if len(data) != entry.nbytes:
            from weightplan.errors import QuantizationError
            raise QuantizationError(f"{entry.key} is cut short ({entry.spec})", file=entry.file,
                                    key=entry.key)
        return data

    def __enter__(self) -> "SmallReader":
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.handles.values():
            os.close(fd)
        self.handles.clear()


_GAP = 4096  # bytes between two small tensors read in one run


def _runs(entries: Sequence[TensorEntry], at: list[int]) -> list[list[int]]:
    """The positions ``at`` (sorted by offset) cut into runs whose gaps are at most
    :data:`_GAP` bytes; each run ends with the offset its bytes end at."""
    runs: list[list[int]] = []
    end = -_GAP - 1
    sizes: dict[int, int] = {}  # by id(spec): the specs are shared
    for i in at:
        entry = entries[i]
        if entry.offset - end > _GAP:
            if runs:
                runs[-1].append(end)
            runs.append([])
        runs[-1].append(i)
        size = sizes.get(id(entry.spec))
        if size is None:
            size = sizes[id(entry.spec)] = entry.nbytes
        end = max(end, entry.offset + size)
    if runs:
        runs[-1].append(end)
    return runs
