"""The reads of a packed dequantize: each stored part's covering box, as bytes.

A rank's slice of a packed weight needs the box of each part that
:func:`~weightplan.planner.core.quant.packed_slices.packed_cover` says covers it. Each box
is read like a plain region: its span (one window: a row slice's contiguous bytes) or,
when the cost model prefers it, only its runs (a column slice's row segments, read by the
strided-read machinery: :func:`~weightplan.planner.tensors.lower.strided.choose_runs`);
the scale tiles and zero points of a weight read by runs are read by runs too.

A stack's parts (the experts of a fused tensor) are mapped and decoded one leading index
at a time: what a read holds mapped at once (:attr:`PackedRead.held`, the plan's window)
is one expert's spans, not the stack's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from weightplan.planner.core.geometry import Region
from weightplan.planner.core.quant.formats import Scheme
from weightplan.planner.core.quant.packed_slices import PackedCover, packed_cover
from weightplan.planner.tensors.lower.strided import ByteRuns, byte_runs, choose_runs


@dataclass(frozen=True, slots=True)
class PartRead:
    """One stored part's read: its ``box`` (``None``: whole), the box's span within the
    part (``first`` byte, ``length``) and, when only they are read, its ``runs``."""

    box: Region | None
    first: int
    length: int
    nbytes: int  # the box's own bytes
    runs: ByteRuns | None = None

    @property
    def asked(self) -> int:
        """Bytes requested from storage: the runs, or the span."""
        return self.runs.nbytes if self.runs is not None else self.length


@dataclass(frozen=True, slots=True)
class PackedRead:
    """A packed read's cover and each part's read (in ``scheme.roles`` order)."""

    cover: PackedCover
    parts: tuple[PartRead, ...]
    by_lead: tuple[bool, ...]  # parts cut per leading index (the rest: read once, whole)
    held: int  # file bytes held at once: one leading index's spans, the others whole


def packed_read_layout(scheme: Scheme, shape: tuple[int, ...], region: Region,
                       parts: tuple[tuple[tuple[int, ...], int], ...], in_file: bool
                       ) -> PackedRead:
    """What a dequantize of ``region`` of a packed weight of logical ``shape`` reads, its
    parts being ``(shape, itemsize)`` each."""
    cover = packed_cover(scheme, tuple(shape), region)
    weight = part_read(cover.parts[0], tuple(parts[0][0]), parts[0][1], in_file)
    rest = (part_read(box, tuple(s), size, in_file, weight.runs is not None)
            for box, (s, size) in zip(cover.parts[1:], parts[1:], strict=True))
    reads = (weight, *rest)
    n = len(shape) - 2
    by_lead = tuple(n > 0 and (box is not None or tuple(s[:n]) == tuple(shape[:n]))
                    for box, (s, _) in zip(cover.parts, parts, strict=True))
    held = sum(lead_span(r, tuple(s), n)[1] * size if cut and r.runs is None else r.asked
               for r, cut, (s, size) in zip(reads, by_lead, parts, strict=True)) if in_file else 0
    return PackedRead(cover, reads, by_lead, held)


def lead_span(read: PartRead, shape: tuple[int, ...], n: int,
              lead: tuple[int, ...] | None = None) -> tuple[int, int]:
    """``(first element, count)`` of index ``lead`` (its first by default) of the ``n``
    leading dims of a part's box, within the part."""
    box = read.box if read.box is not None else Region.full(shape)
    at = box.starts[:n] if lead is None else lead
    sub = Region(tuple(at) + box.starts[n:], tuple(i + 1 for i in at) + box.stops[n:])
    return sub.element_span(shape)


def part_read(box: Region | None, shape: tuple[int, ...], itemsize: int, in_file: bool,
              runs_wanted: bool | None = None) -> PartRead:
    """The read of ``box`` of a part of ``shape`` (the whole part when ``None``): its runs
    when the cost model prefers them, or (``runs_wanted``) when the stored weight's box
    is read by runs (a column slice: its scale tiles' segments, a fraction of the
    weight's, are read alike rather than their whole span)."""
    if box is None or box.is_full(shape):
        total = math.prod(shape) * itemsize
        return PartRead(None, 0, total, total)
    first, count = box.element_span(shape)
    runs = None
    if in_file and runs_wanted is None:
        runs = choose_runs(shape, itemsize, box.starts, box.stops)
    elif in_file and runs_wanted:
        found = byte_runs(shape, itemsize, box.starts, box.stops)
        runs = found if found.count > 1 else None
    return PartRead(box, first * itemsize, count * itemsize, box.numel * itemsize, runs)
