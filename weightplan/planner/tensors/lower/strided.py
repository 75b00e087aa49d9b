"""Strided reads: the runs of bytes a region of a checkpoint tensor is made of.

A region that isn't one run of bytes (a column slice, ``Shard(1)`` of a row-parallel
``o_proj`` / ``down_proj``; ``Shard(2)`` of a fused ``down_proj`` stack) is the rows'
segments ``first + i·stride + [0, run)``. A rank can read the whole span enclosing them
(one call, every row's bytes) or only the segments (one call each, only its bytes);
:func:`choose_runs` prices both and the plan keeps the cheaper.

The cost model: a read costs the bytes it requests plus :data:`CALL_BYTES` per call. One
``preadv`` of a small segment costs 2-4 µs here, Python included (measured: 4096 rows of
1-4 KiB from the page cache, on a shared 2-core machine); a rank of a cluster bound by
storage (what the segments are for: 16 to 32 ranks sharing ~1 GB/s) gets 32-64 MB/s, so a
call costs what ~128 bytes cost. Segments win from gaps of about that size up (hidden
512 on 2 ranks: 512-byte bf16 segments, or 256-byte FP8 ones, with gaps as long;
DeepSeek-V3's expert ``down_proj`` on 8 ranks: 7168 segments of 256 bytes, gaps of 1792).
A single node reading from a warm page cache would rather take spans of segments under
~4 KiB (``choose_runs(..., call_bytes=4096)``); the plan shows which reads took runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from weightplan.planner.core.geometry import CACHE_SIZE

CALL_BYTES = 128  # what one read call costs, in bytes requested (see the module docstring)


@dataclass(frozen=True, slots=True)
class ByteRuns:
    """The byte runs of a region: ``run`` bytes at ``first + Σ i_k · stride_k`` for every
    index ``i_k < count_k`` of ``dims`` (outermost first), in ascending order; offsets
    are from the tensor's first byte."""

    first: int
    run: int
    dims: tuple[tuple[int, int], ...]  # (count, stride in bytes), outermost first

    @property
    def count(self) -> int:
        return math.prod(c for c, _ in self.dims)

    @property
    def nbytes(self) -> int:
        return self.count * self.run

    @property
    def last(self) -> int:
        """The offset of the last run."""
        return self.first + sum((c - 1) * s for c, s in self.dims)

    def offsets(self) -> np.ndarray:
        """Every run's offset, ascending (int64)."""
        out = np.full((1,), self.first, dtype=np.int64)
        for count, stride in self.dims:
            out = (out[:, None] + np.arange(count, dtype=np.int64)[None, :] * stride).ravel()
        return out

    def describe(self) -> str:
        return f"{self.count} runs of {self.run} B"


def byte_runs(shape: tuple[int, ...], itemsize: int, starts: tuple[int, ...],
              stops: tuple[int, ...]) -> ByteRuns:
    """The runs of the box ``[starts, stops)`` of a row-major tensor of ``shape``: the
    innermost run spans the trailing dimensions the box covers whole, and the first one
    it doesn't; each outer dimension it takes part of repeats it."""
    n = len(shape)
    k = n - 1
    while k > 0 and starts[k] == 0 and stops[k] == shape[k]:
        k -= 1
    strides = [itemsize] * n
    for i in range(n - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    run = (stops[k] - starts[k]) * strides[k] if n else itemsize
    first = sum(a * s for a, s in zip(starts, strides, strict=True))
    dims: list[tuple[int, int]] = []
    for i in range(k - 1, -1, -1):  # innermost outer dim first, merged where contiguous
        count = stops[i] - starts[i]
        if count == 1:
            continue
        if dims and dims[0][0] * dims[0][1] == strides[i]:
            dims[0] = (dims[0][0] * count, dims[0][1])
        else:
            dims.insert(0, (count, strides[i]))
    return ByteRuns(first, run, tuple(dims))


@lru_cache(maxsize=CACHE_SIZE)
def choose_runs(shape: tuple[int, ...], itemsize: int, starts: tuple[int, ...],
                stops: tuple[int, ...], call_bytes: int = CALL_BYTES) -> ByteRuns | None:
    """The runs of the box when reading them costs less than reading its span (one call
    and every byte between its first and last); ``None``: read the span (one run, an
    empty box, or runs too small for their calls)."""
    if any(b <= a for a, b in zip(starts, stops, strict=True)):
        return None
    runs = byte_runs(shape, itemsize, starts, stops)
    count = runs.count
    if count <= 1:
        return None
    span = runs.last + runs.run - runs.first
    return runs if count * call_bytes + runs.nbytes < call_bytes + span else None


def span_bytes(runs: ByteRuns) -> int:
    """The bytes from the first run's first byte to the last run's last."""
    return runs.last + runs.run - runs.first
