"""What the reads of a stack's stream share, told where its nodes are made."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import NamedTuple

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.spec import TensorSpec

_STACK = 8  # fewer reads in a stream: one at a time is as quick
_SPEC, _FILE = attrgetter("spec"), attrgetter("file")

# What every read of a stack's stream has in common, as :func:`_geometry` takes it: the
# entries' (shape, dtype, in memory, contiguous), the scales' (shape, dtype) and the block
ReadParts = tuple[tuple[int, ...], torch.dtype, bool, bool, tuple[int, ...] | None,
                  torch.dtype | None, tuple[int, ...] | None]


class AlikeReads(NamedTuple):
    """What every read of a stack's stream shares (``parts``), and the entries it reads."""

    parts: ReadParts
    entries: Sequence[TensorEntry]


def alike_reads(entries: Sequence[TensorEntry], scales: Sequence[TensorSpec] | None,
                block: tuple[int, ...] | None) -> AlikeReads | None:
    """The parts the reads of ``entries`` share, or ``None`` when their specs, placement
    (file or memory) or contiguity differ, or they are too few to be worth it. With
    ``scales`` (each read's scale spec, all equal) and ``block`` (the caller vouches that
    it is every read's), the reads are dequantized ones. Told where a stream's nodes are
    made, while its entries are at hand, so that :func:`placed_reads` makes the stream's
    tasks in columns without looking at each read again."""
    n = len(entries)
    if n < _STACK or (scales is not None and (len(scales) != n or not same(scales))):
        return None
    specs, nones = list(map(_SPEC, entries)), list(map(_FILE, entries)).count(None)
    # one class of entry: one contiguity (a StridedEntry's is False, a TensorEntry's True)
    if not (same(specs) and nones in (0, n) and same(list(map(type, entries)))):
        return None
    spec, memory, contiguous = specs[0], nones == n, entries[0].contiguous
    if scales is None or block is None:
        return AlikeReads((spec.shape, spec.dtype, memory, contiguous, None, None, None),
                          entries)
    scale = scales[0]
    return AlikeReads((spec.shape, spec.dtype, memory, contiguous, scale.shape, scale.dtype,
                       block), entries)


def same(column: Sequence[object]) -> bool:
    """Every item of a non-empty ``column`` equals the first (compared by identity first)."""
    return column.count(column[0]) == len(column)
