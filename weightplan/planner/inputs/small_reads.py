"""Small integer tensors read at plan time (``weight_shape``'s 2–3 values, a per-tensor
scale's raw bytes): a batch at a time, each file's in runs of nearby tensors, one
``pread`` a run.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, is_, is_not

import numpy as np
import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.spec import TensorSpec

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
        if not entries:
            return out
        specs, files = list(map(_SPEC, entries)), list(map(_FILE, entries))
        offsets = list(map(_OFFSET, entries))
        ids = list(map(id, specs))
        unique = dict(zip(ids, specs, strict=True))  # (the specs are shared)
        if any(spec.dtype not in INTEGER_CODES for spec in unique.values()):
            entry = next(e for e in entries if e.spec.dtype not in INTEGER_CODES)
            from weightplan.errors import QuantizationError
            raise QuantizationError(f"{entry.key} is not an integer tensor ({entry.spec})",
                                    file=entry.file, key=entry.key)
        at = list(compress(range(len(entries)), map(is_not, files, repeat(None))))
        if len(at) < len(entries):  # (in-memory tensors: a dict's)
            assert self.tensors is not None
            for i in compress(range(len(entries)), map(is_, files, repeat(None))):
                t = self.tensors[entries[i].key]
                out[i] = tuple(int(v) for v in t.reshape(-1).tolist())
        if not at:
            return out
        if len(at) < len(entries):
            files, ids = list(map(files.__getitem__, at)), list(map(ids.__getitem__, at))
            offsets = list(map(offsets.__getitem__, at))
        self._read_files(entries, at, unique, files, ids, offsets, out)
        return out

    def _read_files(self, entries: Sequence[TensorEntry], at: list[int],
                    specs: dict[int, TensorSpec], files: list[str], ids: list[int],
                    offsets: Iterable[int], out: list[tuple[int, ...]]) -> None:
        """The entries ``at`` (in ``files``, with the specs ``ids`` and ``offsets``) read
        in runs (see :func:`_runs`), decoded in columns: each spec's values gathered from
        the runs' bytes at once."""
        n = len(at)
        names = list(dict.fromkeys(files))
        file_at = {f: i for i, f in enumerate(names)}
        sizes = {i: spec.nbytes for i, spec in specs.items()}
        spec_ids = np.array(ids, np.int64)  # (an id fits: a CPython address)
        size = np.fromiter(map(sizes.__getitem__, ids), np.int64, n)
        offset = np.fromiter(offsets, np.int64, n)
        which = np.fromiter(map(file_at.__getitem__, files), np.int64, n)
        starts, ends, first, order = _runs(which, offset, size)
        blob = bytearray()
        base = np.empty(len(starts), np.int64)  # each run's first byte in blob
        length = np.empty(len(starts), np.int64)  # each run's bytes read
        for r, (f, start, stop) in enumerate(zip(which[order][first].tolist(),
                                                 starts.tolist(), ends.tolist(), strict=True)):
            base[r] = len(blob)
            blob += self._pread(names[f], stop - start, start)
            length[r] = len(blob) - base[r]
        run = np.zeros(n, np.int64)
        run[first[1:]] = 1
        run = np.cumsum(run)  # each sorted row's run
        rel = offset[order] - starts[run]
        short = np.flatnonzero(rel + size[order] > length[run])
        if len(short):
            entry = entries[at[int(order[short[0]])]]
            from weightplan.errors import QuantizationError
            raise QuantizationError(f"{entry.key} is cut short ({entry.spec})",
                                    file=entry.file, key=entry.key)
        data = np.frombuffer(blob, np.uint8)
        where = base[run] + rel
        sorted_ids, positions_of = spec_ids[order], np.array(at, np.int64)
        for spec_id, spec in specs.items():
            rows = np.flatnonzero(sorted_ids == spec_id)
            if not len(rows) or spec.nbytes == 0:
                continue
            gathered = data[where[rows, None] + np.arange(spec.nbytes)]
            values = gathered.view(f"<{INTEGER_CODES[spec.dtype]}").tolist()
            positions = positions_of[order[rows]].tolist()
            deque(map(out.__setitem__, positions, map(tuple, values)), maxlen=0)

    def _pread(self, file: str, size: int, start: int) -> bytes:
        fd = self.handles.get(file)
        if fd is None:
            fd = self.handles[file] = os.open(file, os.O_RDONLY)
        return os.pread(fd, size, start)

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
_SPEC, _FILE, _OFFSET = attrgetter("spec"), attrgetter("file"), attrgetter("offset")


def _runs(which: np.ndarray, offset: np.ndarray, size: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tensors (file index, offset, bytes) sorted by file and offset, cut into runs
    whose gaps are at most :data:`_GAP` bytes: ``(starts, ends, first, order)``, each
    run's first and end byte, the sorted position of its first tensor, and the order."""
    end = offset + size
    span = int(end.max()) + _GAP + 1  # (a file apart: past any gap)
    key = which * span + offset
    order = np.argsort(key, kind="stable")
    key, stop = key[order], (which * span + end)[order]
    reached = np.maximum.accumulate(stop)
    first = np.flatnonzero(np.concatenate(([True], key[1:] - reached[:-1] > _GAP)))
    last = np.concatenate((first[1:], [len(order)])) - 1
    return offset[order][first], reached[last] - which[order][first] * span, first, order
