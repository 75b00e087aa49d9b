"""The reads of a packed dequantize: each stored part's covering box, as bytes.

A rank's slice of a packed weight needs the box of each part that
:func:`~weightplan.planner.core.quant.packed_slices.packed_cover` says covers it. Each box
is read like a plain region: its span (one window: a row slice's contiguous bytes) or,
when the cost model prefers it, only its runs (a column slice's row segments, read by the
strided-read machinery: :func:`~weightplan.planner.tensors.lower.strided.choose_runs`);
the scale tiles and zero points of a weight read by runs are read by runs too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from weightplan.planner.core.geometry import CACHE_SIZE, Region
from weightplan.planner.core.quant.formats import Scheme
from weightplan.planner.core.quant.packed_slices import PackedCover, packed_cover
from weightplan.planner.tensors.lower.strided import ByteRuns, byte_runs, choose_runs
from weightplan.planner.tensors.lower.read_tasks import ReadLayout
from weightplan.planner.tensors.ir.nodes import Node, read_attrs


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


def packed_read_layout(scheme: Scheme, shape: tuple[int, ...], region: Region,
                       parts: tuple[tuple[tuple[int, ...], int], ...], in_file: bool
                       ) -> PackedRead:
    """What a dequantize of ``region`` of a packed weight of logical ``shape`` reads, its
    parts being ``(shape, itemsize)`` each."""
    cover = packed_cover(scheme, tuple(shape), region)
    weight = part_read(cover.parts[0], tuple(parts[0][0]), parts[0][1], in_file)
    rest = (part_read(box, tuple(s), size, in_file, weight.runs is not None)
            for box, (s, size) in zip(cover.parts[1:], parts[1:], strict=True))
    return PackedRead(cover, (weight, *rest))


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


def packed_layout(node: Node, region: Region) -> ReadLayout:
    """A packed dequantize reads, of its stored weight and each part, only the box that
    covers ``region`` (a rank's slice: its rows' bytes, or its columns' runs, and the
    scale tiles over them; see :mod:`~weightplan.planner.core.quant.packed_slices`)."""
    entries = tuple(read_attrs(p).entry for p in node.inputs)
    return _packed_layout(tuple((e.spec.shape, e.spec.dtype.itemsize) for e in entries),
                          entries[0].file is not None, node.attrs.scheme,  # type: ignore[union-attr]
                          node.spec.shape, region)


@lru_cache(maxsize=CACHE_SIZE)
def _packed_layout(parts: tuple[tuple[tuple[int, ...], int], ...], in_file: bool,
                   scheme: object, shape: tuple[int, ...], region: Region) -> ReadLayout:
    """One layout per geometry (the experts of a stack share it)."""
    from weightplan.planner.core.quant.formats import workspace_bytes as packed_workspace

    read = packed_read_layout(scheme, shape, region, parts, in_file)  # type: ignore[arg-type]
    weight = read.parts[0]
    work = packed_workspace(scheme, read.cover.box.shape)  # type: ignore[arg-type]
    window = sum(p.asked for p in read.parts) if in_file else 0
    others = sum(p.nbytes for p in read.parts[1:])
    return ReadLayout(False, weight.first, weight.length, ((0, weight.length),), window + work,
                      others, sum(p.asked for p in read.parts), weight.runs, None, read)
