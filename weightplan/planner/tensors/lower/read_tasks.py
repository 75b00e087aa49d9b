"""Read tasks: which bytes of a checkpoint tensor a step reads, and where they land; a
step's placed sources made into them (:func:`placed_reads`).

A :class:`ReadTask` names its READ (or DEQUANTIZE) node, the region read and the fragment
it lands in; everything else (byte offsets, pieces read in parallel, mapped window, scale
tiles) is its :class:`ReadLayout`, computed once per geometry and shared by every read of
that geometry: the 256 experts of a stack hold one layout, one region and one view shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from itertools import compress, repeat
from typing import TYPE_CHECKING

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.core.makers import columns, slot_setters
from weightplan.planner.core.ops.base import Streams
from weightplan.planner.core.quant.blocks import DEQUANTIZE_BYTES, workspace_bytes
from weightplan.planner.core.geometry import (
    CACHE_SIZE, Fragment, Region, StackFragments, _is_contiguous,
)
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.lower.stack_reads import PACKED, stack_geometry
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, read_attrs
from weightplan.planner.core.sharding.fp8_slices import scale_region
from weightplan.planner.core.spec import TensorSpec

if TYPE_CHECKING:  # (a packed format's reads: imported where a plan has one; strided reads)
    from weightplan.planner.tensors.lower.strided import ByteRuns
    from weightplan.planner.tensors.lower.packed_reads import PackedRead

PIECE_BYTES = 4 * 1024 * 1024  # direct reads larger than this are split into pieces


@dataclass(frozen=True, slots=True)
class ReadLayout:
    """How a read of one geometry goes, shared by every read of it (the experts of a
    stack): computed once per (shape, region, block, direct) by :func:`read_task`."""

    direct: bool  # a plain byte copy: contiguous destination, same dtype, one byte range
    first: int  # the region's first byte, from the tensor's first byte
    length: int  # bytes from the first to the last byte of the region
    pieces: tuple[tuple[int, int], ...]  # (offset within the range, length) windows
    window_bytes: int  # the largest file window mapped at once (0 in memory), plus work_bytes
    scale_bytes: int  # the scale tiles a dequantize reads (see scale_region)
    requested: int  # bytes requested from storage: the span or its runs, scale included
    runs: ByteRuns | None = None  # set: only these runs of the span are read (strided.py)
    scale_runs: ByteRuns | None = None  # likewise for the scale tiles of a dequantize
    packed: PackedRead | None = None  # a packed dequantize: each part's box (packed_reads.py)


@dataclass(frozen=True, slots=True, init=False)
class ReadTask:
    """Read ``region`` of a checkpoint tensor; land it in ``fragment`` (or keep it whole).

    ``byte_range`` is (absolute file offset, length); ``pieces`` are (offset within the
    range, length) windows read in parallel. Built by :func:`read_task`; everything but
    the node, its entry, region and fragment is in ``layout``, one object per geometry.
    (Its slots are written through their descriptors, past the frozen ``__setattr__``.)
    """

    node: Node  # the READ node this task lowers (or the DEQUANTIZE node behind a read)
    entry: TensorEntry  # the READ node's (the one the schedule's order and the executor read)
    region: Region
    fragment: Fragment | None  # None: kept as an input of the materialized ops
    layout: ReadLayout

    def __init__(self, node: Node, entry: TensorEntry, region: Region,
                 fragment: Fragment | None, layout: ReadLayout) -> None:
        _set_node(self, node)
        _set_entry(self, entry)
        _set_region(self, region)
        _set_fragment(self, fragment)
        _set_layout(self, layout)

    @property
    def direct(self) -> bool:
        return self.layout.direct

    @property
    def byte_range(self) -> tuple[int, int]:
        return self.entry.offset + self.layout.first, self.layout.length

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        return self.layout.pieces

    @property
    def window_bytes(self) -> int:
        return self.layout.window_bytes

    @property
    def scale_bytes(self) -> int:
        return self.layout.scale_bytes

    @property
    def read(self) -> Node:
        """The READ node of the bytes (a dequantize's weight input)."""
        node = self.node
        return node.inputs[0] if node.kind is NodeKind.DEQUANTIZE else node

    @property
    def source(self) -> tuple[int, int]:
        return read_attrs(self.read).source

    @property
    def dequantize(self) -> DequantizeAttrs | None:
        """Set when the read's bytes are FP8 dequantized on their way (scale: ``scale``)."""
        a = self.node.attrs
        return a if isinstance(a, DequantizeAttrs) else None

    @property
    def scale(self) -> TensorEntry | None:
        return read_attrs(self.node.inputs[1]).entry if self.dequantize is not None else None

    @property
    def scale_region(self) -> Region | None:
        """The scale tiles a dequantize reads: those covering ``region`` (a rank's slice
        reads only its own), or the whole scale when it is per-tensor."""
        if self.dequantize is None or self.scale is None or self.dequantize.scheme is not None:
            return None
        return scale_region(self.entry.spec.shape, self.scale.spec.shape, self.region,
                            self.dequantize.block)

    @property
    def work_bytes(self) -> int:
        """Besides the window: a dequantize's scales and its fp32 chunk workspace."""
        if self.dequantize is None or self.scale is None:
            return 0
        if self.dequantize.scheme is not None:  # a packed format: its parts, its workspace
            from weightplan.planner.core.quant.formats import workspace_bytes as packed_workspace

            return self.scale_bytes + packed_workspace(
                self.dequantize.scheme, self.node.spec.shape)  # type: ignore[arg-type]
        return self.scale_bytes + workspace_bytes(self.region.shape, self.dequantize.block,
                                                   per_element=DEQUANTIZE_BYTES)

    @property
    def nbytes(self) -> int:
        return self.layout.length

    @property
    def needed_bytes(self) -> int:
        """The bytes of the region read, a dequantize's scale tiles included (a packed
        one's: every part's covering box)."""
        packed = self.layout.packed
        if packed is not None:
            return sum(p.nbytes for p in packed.parts)
        return self.region.numel * self.entry.spec.dtype.itemsize + self.scale_bytes

    @property
    def tmp_bytes(self) -> int:
        """Bytes of a temporary kept after the read (only for materialized-op inputs)."""
        if self.fragment is not None:
            return 0
        if self.dequantize is not None:
            return self.region.numel * self.dequantize.dtype.itemsize
        return self.nbytes if self.entry.file is not None else 0


_set_node, _set_entry, _set_region, _set_fragment, _set_layout = slot_setters(
    ReadTask, [f.name for f in fields(ReadTask)])


def read_task(node: Node, region: Region, fragment: Fragment | None, direct: bool,
              piece_bytes: int = PIECE_BYTES) -> ReadTask:
    """The byte range of ``region`` of ``node``'s entry; direct reads over ``piece_bytes``
    are split into pieces so that they run in parallel (each piece is one mapped window)."""
    if node.kind is NodeKind.DEQUANTIZE and node.attrs.scheme is not None:  # type: ignore[union-attr]
        return ReadTask(node, read_attrs(node.inputs[0]).entry, region, fragment,
                        packed_layout(node, region))
    entry, scale, block = read_parts(node)
    layout = task_layout(entry.spec, entry.file is not None, scale, block, region, direct,
                          piece_bytes)
    return ReadTask(node, entry, region, fragment, layout)


def read_parts(node: Node) -> tuple[TensorEntry, TensorSpec | None, tuple[int, ...] | None]:
    """The entry ``node`` reads, and for a dequantize its scale's spec and block."""
    if node.kind is not NodeKind.DEQUANTIZE:
        return read_attrs(node).entry, None, None
    entry = read_attrs(node.inputs[0]).entry
    a = node.attrs
    if not isinstance(a, DequantizeAttrs):
        return entry, None, None
    return entry, read_attrs(node.inputs[1]).entry.spec, a.block


def task_layout(spec: TensorSpec, in_file: bool, scale: TensorSpec | None,
                 block: tuple[int, ...] | None, region: Region, direct: bool, piece_bytes: int
                 ) -> ReadLayout:
    scale_shape, scale_size = (None, 0) if scale is None or block is None else (
        scale.shape, scale.dtype.itemsize)
    return _layout(spec.shape, spec.dtype.itemsize, in_file, scale_shape, scale_size, block,
                   region.starts, region.stops, direct, piece_bytes)


@lru_cache(maxsize=CACHE_SIZE)
def _layout(shape: tuple[int, ...], size: int, in_file: bool,
            scale_shape: tuple[int, ...] | None, scale_size: int, block: tuple[int, ...] | None,
            starts: tuple[int, ...], stops: tuple[int, ...], direct: bool, piece_bytes: int
            ) -> ReadLayout:
    """The layout of a read: the same for every tensor of one shape read the same way.
    A file read that isn't one run of bytes reads only its runs when they cost less than
    its span (:func:`~weightplan.planner.tensors.lower.strided.choose_runs`)."""
    region = Region(starts, stops)
    first, count = region.element_span(shape)
    total = count * size
    if direct and total > piece_bytes:
        pieces = tuple((s, min(piece_bytes, total - s)) for s in range(0, total, piece_bytes))
    else:
        pieces = ((0, total),)
    runs = None
    if not direct and in_file:  # (lru-cached: the strided module imported by the first such read)
        from weightplan.planner.tensors.lower.strided import choose_runs
        runs = choose_runs(shape, size, starts, stops)
    # a strided read lands its runs in a buffer of the region's size (or straight in place)
    window = 0 if not in_file else runs.nbytes if runs is not None else pieces[0][1]
    asked = total if runs is None else runs.nbytes
    if scale_shape is None or block is None:
        return ReadLayout(direct, first * size, total, pieces, window, 0, asked, runs)
    # the window holds the whole scale; scale_bytes counts only its covering tiles
    from weightplan.planner.tensors.lower.strided import choose_runs  # (FP8: lru-cached)
    work = workspace_bytes(region.shape, block, per_element=DEQUANTIZE_BYTES)
    tiles = scale_region(shape, scale_shape, region, block)
    tile_bytes = tiles.numel * scale_size
    scale_runs = choose_runs(scale_shape, scale_size, tiles.starts, tiles.stops) if in_file else None
    scale_asked = (tile_bytes if not in_file else scale_runs.nbytes if scale_runs is not None
                   else tiles.element_span(scale_shape)[1] * scale_size)
    return ReadLayout(direct, first * size, total, pieces,
                      window + math.prod(scale_shape) * scale_size + work, tile_bytes,
                      asked + scale_asked, runs, scale_runs)


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
    from weightplan.planner.tensors.lower.packed_reads import packed_read_layout

    read = packed_read_layout(scheme, shape, region, parts, in_file)  # type: ignore[arg-type]
    weight = read.parts[0]
    work = packed_workspace(scheme, read.cover.box.shape)  # type: ignore[arg-type]
    window = read.held  # (one expert's mapped spans at a time: see packed_reads)
    others = sum(p.nbytes for p in read.parts[1:])
    return ReadLayout(False, weight.first, weight.length, ((0, weight.length),), window + work,
                      others, sum(p.asked for p in read.parts), weight.runs, None, read)


def placed_reads(sources: Streams[Node], frags: Streams[tuple[Fragment, ...]],
                 dests: tuple[Destination, ...], piece_bytes: int) -> tuple[ReadTask, ...]:
    """A read task for each non-empty fragment each source lands in, with the layout of
    its geometry (:func:`read_geometry`). A stream whose reads all share one geometry (a
    stack: :func:`stack_geometry` says so from the nodes and fragments, in columns; a
    packed stack's layout is its parts' boxes) is made in columns with that one layout;
    any other read by read. Either way, the same tasks. Items landing nowhere (another
    rank's experts) are left out first, so that a rank's experts of a stack are made in
    columns too."""
    tasks: list[ReadTask] = []
    for stream, placed in zip(sources, frags, strict=True):
        if isinstance(placed, StackFragments):  # (the run of a stack that lands: its own stack)
            stream = stream[placed.first:placed.first + len(placed.fragments)]
            placed = placed.landing()
        elif len(stream) >= _STACK and not all(placed):  # (expert parallel)
            kept = list(map(bool, placed))
            stream, placed = tuple(compress(stream, kept)), tuple(compress(placed, kept))
        stack = stack_geometry(stream, placed) if len(stream) >= _STACK else None
        if stack is None:
            _each_read(tasks, stream, placed, dests, piece_bytes)
            continue
        parts, entries, landed, region, target = stack
        if parts[0] is PACKED:  # (one box per part, whatever the destination's dtype)
            layout = packed_layout(stream[0], region) if region.numel else None
        else:
            layout = read_geometry(*parts, dests[target].spec.dtype, piece_bytes)
        if layout is not None:
            tasks += _tasks(len(stream), stream, entries, repeat(region), landed, repeat(layout))
    return tuple(tasks)


_STACK = 8  # fewer reads in a stream: telling whether they are alike costs what it saves


def _each_read(tasks: list[ReadTask], stream: tuple[Node, ...],
               frags: tuple[tuple[Fragment, ...], ...], dests: tuple[Destination, ...],
               piece_bytes: int) -> None:
    """The read tasks of one stream, node by node, fragment by fragment."""
    last: tuple = ()
    layout: ReadLayout | None = None
    packed: dict[tuple, ReadLayout] = {}  # packed dequantizes: by scheme, specs and region
    for j, node in enumerate(stream):
        if not frags[j]:  # (another rank's expert: nothing lands here)
            continue
        scheme = getattr(node.attrs, "scheme", None) if node.kind is NodeKind.DEQUANTIZE else None
        if scheme is not None:
            # the experts of a stack share the scheme object, their parts' specs (one per
            # dtype and shape) and the region object: one layout for all of them
            parts = [read_attrs(p).entry for p in node.inputs]
            same = (id(scheme), node.spec.shape, parts[0].file is None,
                    *[id(e.spec) for e in parts])
            for f in frags[j]:
                if not f.region.numel:
                    continue
                shared = packed.get((same, id(f.region)))
                if shared is None:
                    shared = packed[(same, id(f.region))] = packed_layout(node, f.region)
                tasks.append(ReadTask(node, parts[0], f.region, f, shared))
            continue
        entry, scale, block = read_parts(node)
        spec = entry.spec
        scale_shape, scale_dtype = (None, None) if scale is None else (scale.shape,
                                                                      scale.dtype)
        for f in frags[j]:
            v = f.view
            # the experts of a stack share every part of this key (equal tuples and
            # dtypes, the same region object): one layout for all of them
            key = (spec.shape, spec.dtype, entry.file is None, entry.contiguous,
                   scale_shape, scale_dtype, block, f.region, v.shape, v.stride,
                   dests[f.target].spec.dtype, piece_bytes)
            if key != last:
                last, layout = key, read_geometry(*key)
            if layout is not None:
                tasks.append(ReadTask(node, entry, f.region, f, layout))


_tasks = columns(ReadTask)  # (~45k tasks in a DeepSeek-V3 plan)


@lru_cache(maxsize=CACHE_SIZE)
def read_geometry(shape: tuple[int, ...], dtype: torch.dtype, in_memory: bool, contiguous: bool,
              scale_shape: tuple[int, ...] | None, scale_dtype: torch.dtype | None,
              block: tuple[int, ...] | None, region: Region, view_shape: tuple[int, ...],
              view_stride: tuple[int, ...], dest_dtype: torch.dtype, piece_bytes: int
              ) -> ReadLayout | None:
    """The layout of a placed read (``None``: an empty region, nothing read). Direct: the
    entry is contiguous and of the destination's dtype, the view contiguous and the region
    one run of bytes."""
    if region.numel == 0:
        return None
    _, count = region.element_span(shape)
    direct = (contiguous and _is_contiguous(view_shape, view_stride) and count == region.numel
              and dest_dtype == dtype)
    scale = None if scale_shape is None or scale_dtype is None else TensorSpec(scale_shape,
                                                                               scale_dtype)
    return task_layout(TensorSpec(shape, dtype), not in_memory, scale, block, region, direct,
                        piece_bytes)
