"""Read tasks: which bytes of a checkpoint tensor a step reads, and where they land.

A :class:`ReadTask` names its READ (or DEQUANTIZE) node, the region read and the fragment
it lands in; everything else (byte offsets, pieces read in parallel, mapped window, scale
tiles) is its :class:`ReadLayout`, computed once per geometry and shared by every read of
that geometry: the 256 experts of a stack hold one layout, one region and one view shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import attrgetter, itemgetter

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.core.makers import columns, maker
from weightplan.planner.core.quant.blocks import DEQUANTIZE_BYTES, workspace_bytes
from weightplan.planner.core.quant.formats import workspace_bytes as packed_workspace
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import (
    CACHE_SIZE, Fragment, Region, StackFragments, StackRecord, _is_contiguous,
)
from weightplan.planner.tensors.ir.alike import AlikeReads, ReadParts, same as _same
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, read_attrs
from weightplan.planner.core.ops.base import Streams
from weightplan.planner.core.sharding.fp8_slices import scale_region
from weightplan.planner.core.spec import TensorSpec

PIECE_BYTES = 32 * 1024 * 1024  # direct reads larger than this are split into pieces


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


@dataclass(frozen=True, slots=True)
class ReadTask:
    """Read ``region`` of a checkpoint tensor; land it in ``fragment`` (or keep it whole).

    ``byte_range`` is (absolute file offset, length); ``pieces`` are (offset within the
    range, length) windows read in parallel. Built by :func:`read_task`; everything but
    the node, region and fragment is in ``layout``, one object per geometry.
    """

    node: Node  # the READ node this task lowers (or the DEQUANTIZE node behind a read)
    region: Region
    fragment: Fragment | None  # None: kept as an input of the materialized ops
    layout: ReadLayout

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
    def entry(self) -> TensorEntry:
        node = self.node  # (self.read, inline: the schedule asks once per read)
        return read_attrs(node.inputs[0] if node.kind is NodeKind.DEQUANTIZE else node).entry

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
            return self.scale_bytes + packed_workspace(
                self.dequantize.scheme, self.node.spec.shape)  # type: ignore[arg-type]
        return self.scale_bytes + workspace_bytes(self.region.shape, self.dequantize.block,
                                                   per_element=DEQUANTIZE_BYTES)

    @property
    def nbytes(self) -> int:
        return self.layout.length

    @property
    def tmp_bytes(self) -> int:
        """Bytes of a temporary kept after the read (only for materialized-op inputs)."""
        if self.fragment is not None:
            return 0
        if self.dequantize is not None:
            return self.region.numel * self.dequantize.dtype.itemsize
        return self.nbytes if self.entry.file is not None else 0


_task = maker(ReadTask)  # (~45k tasks in a DeepSeek-V3 plan)


def read_task(node: Node, region: Region, fragment: Fragment | None, direct: bool,
              piece_bytes: int = PIECE_BYTES) -> ReadTask:
    """The byte range of ``region`` of ``node``'s entry; direct reads over ``piece_bytes``
    are split into pieces so that they run in parallel (each piece is one mapped window)."""
    if node.kind is NodeKind.DEQUANTIZE and node.attrs.scheme is not None:  # type: ignore[union-attr]
        return ReadTask(node, region, fragment, packed_layout(node))
    entry, scale, block = _read_parts(node)
    return ReadTask(node, region, fragment, _task_layout(entry.spec, entry.file is not None,
                                                         scale, block, region, direct,
                                                         piece_bytes))


def _read_parts(node: Node) -> tuple[TensorEntry, TensorSpec | None, tuple[int, ...] | None]:
    """The entry ``node`` reads, and for a dequantize its scale's spec and block."""
    if node.kind is not NodeKind.DEQUANTIZE:
        return node.attrs.entry, None, None  # type: ignore[union-attr]
    entry: TensorEntry = node.inputs[0].attrs.entry  # type: ignore[union-attr]
    a = node.attrs
    if not isinstance(a, DequantizeAttrs):
        return entry, None, None
    return entry, node.inputs[1].attrs.entry.spec, a.block  # type: ignore[union-attr]


def _task_layout(spec: TensorSpec, in_file: bool, scale: TensorSpec | None,
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
    """The layout of a read: the same for every tensor of one shape read the same way."""
    region = Region(starts, stops)
    first, count = region.element_span(shape)
    total = count * size
    if direct and total > piece_bytes:
        pieces = tuple((s, min(piece_bytes, total - s)) for s in range(0, total, piece_bytes))
    else:
        pieces = ((0, total),)
    window = 0 if not in_file else pieces[0][1]  # the first piece is the largest
    if scale_shape is None or block is None:
        return ReadLayout(direct, first * size, total, pieces, window, 0)
    # the window holds the whole scale; scale_bytes counts only its covering tiles
    work = workspace_bytes(region.shape, block, per_element=DEQUANTIZE_BYTES)
    tiles = scale_region(shape, scale_shape, region, block).numel * scale_size
    return ReadLayout(direct, first * size, total, pieces,
                      window + math.prod(scale_shape) * scale_size + work, tiles)


def packed_layout(node: Node) -> ReadLayout:
    """A packed dequantize reads its whole stored weight (one window) and its parts,
    whatever region it lands: the codes of a row are only whole with its scales."""
    weight = read_attrs(node.inputs[0]).entry
    parts = sum(read_attrs(p).entry.nbytes for p in node.inputs[1:])
    return _packed_layout(weight.nbytes, weight.file is not None, parts,
                          node.attrs.scheme, node.spec.shape)  # type: ignore[union-attr]


@lru_cache(maxsize=CACHE_SIZE)
def _packed_layout(total: int, in_file: bool, parts: int, scheme: object,
                   shape: tuple[int, ...]) -> ReadLayout:
    """One layout per geometry (the experts of a stack share it)."""
    work = packed_workspace(scheme, shape)  # type: ignore[arg-type]
    window = total if in_file else 0
    return ReadLayout(False, 0, total, ((0, total),), window + parts + work, parts)


def placed_reads(sources: Streams[Node], frags: Streams[tuple[Fragment, ...]],
                 dests: tuple[Destination, ...], piece_bytes: int,
                 alike: Sequence[AlikeReads | None] = ()
                 ) -> tuple[tuple[ReadTask, ...], tuple[ReadRun, ...]]:
    """A read task for each non-empty fragment each source lands in: one read at a time,
    or a stack's stream in columns (:func:`stack_reads`, a :class:`ReadRun` of the tasks)
    when ``alike`` (by stream, from where the nodes were made) tells what its reads share."""
    tasks: list[ReadTask] = []
    runs: list[ReadRun] = []
    dtypes = [d.spec.dtype for d in dests]
    for i, stream in enumerate(sources):
        same = alike[i] if i < len(alike) else None
        made = None if same is None else stack_reads(stream, frags[i], same.parts, dtypes,
                                                     piece_bytes)
        if made is None:
            _each_read(tasks, stream, frags[i], dtypes, piece_bytes)
        elif made[0] is not None and same is not None:
            whole = frags[i]
            stack = whole.record() if isinstance(whole, StackFragments) else None
            runs.append(_run(len(tasks), len(made[1]), made[0], same.entries, stack))
            tasks += made[1]
    return tuple(tasks), tuple(runs)


def _each_read(tasks: list[ReadTask], stream: tuple[Node, ...],
               frags: tuple[tuple[Fragment, ...], ...], dtypes: list[torch.dtype],
               piece_bytes: int) -> None:
    """The read tasks of one stream, node by node, fragment by fragment (the exact way)."""
    last: tuple = ()
    layout: ReadLayout | None = None
    for j, node in enumerate(stream):
        if node.kind is NodeKind.DEQUANTIZE and node.attrs.scheme is not None:  # type: ignore[union-attr]
            tasks += [_task(node, f.region, f, packed_layout(node)) for f in frags[j]
                      if f.region.numel]
            continue
        entry, scale, block = _read_parts(node)
        spec = entry.spec
        scale_shape, scale_dtype = (None, None) if scale is None else (scale.shape,
                                                                      scale.dtype)
        for f in frags[j]:
            v = f.view
            # the experts of a stack share every part of this key (equal tuples and
            # dtypes, the same region object): one layout for all of them
            key = (spec.shape, spec.dtype, entry.file is None, entry.contiguous,
                   scale_shape, scale_dtype, block, f.region, v.shape, v.stride,
                   dtypes[f.target], piece_bytes)
            if key != last:
                last, layout = key, _geometry(*key)
            if layout is not None:
                tasks.append(_task(node, f.region, f, layout))


_tasks = columns(ReadTask)

@dataclass(frozen=True, slots=True)
class ReadRun:
    """Tasks ``start .. start + count - 1`` of a step, made in columns by
    :func:`stack_reads`: all of ``layout``, all placed, reading ``entries`` in order."""

    start: int
    count: int
    layout: ReadLayout
    entries: Sequence[TensorEntry]
    stack: StackRecord | None = None  # where its reads land, when placement recorded it


_run = maker(ReadRun)


def stack_reads(stream: tuple[Node, ...], frags: tuple[tuple[Fragment, ...], ...],
                parts: ReadParts, dtypes: list[torch.dtype], piece_bytes: int
                ) -> tuple[ReadLayout | None, list[ReadTask]] | None:
    """The read tasks of a stack's stream whose reads share ``parts``, made in columns
    with one layout when each lands in exactly one fragment, all of one region, view
    shape, stride and target (as a stack's are: :class:`StackFragments` says so without
    looking): their layout and the tasks, the same ones :func:`_each_read` makes; ``None``:
    not so."""
    n = len(stream)
    if isinstance(frags, StackFragments) and len(frags) == n:
        fs, region, target = frags.fragments, frags.region, frags.target
        shape, stride = frags.shape, frags.stride
        regions: Iterable[Region] = repeat(region)
    else:
        if list(map(len, frags)).count(1) != n:
            return None
        fs = list(map(_FIRST, frags))
        regions, views, targets = (list(map(_REGION, fs)), list(map(_VIEW, fs)),
                                   list(map(_TARGET, fs)))
        shapes, strides = list(map(_SHAPE, views)), list(map(_STRIDE, views))
        if not (_same(regions) and _same(shapes) and _same(strides) and _same(targets)):
            return None
        region, target, shape, stride = regions[0], targets[0], shapes[0], strides[0]
    layout = _geometry(*parts, region, shape, stride, dtypes[target], piece_bytes)
    return layout, [] if layout is None else _tasks(n, stream, regions, fs, repeat(layout))


_REGION, _VIEW, _TARGET = attrgetter("region"), attrgetter("view"), attrgetter("target")
_SHAPE, _STRIDE, _FIRST = attrgetter("shape"), attrgetter("stride"), itemgetter(0)


@lru_cache(maxsize=CACHE_SIZE)
def _geometry(shape: tuple[int, ...], dtype: torch.dtype, in_memory: bool, contiguous: bool,
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
    return _task_layout(TensorSpec(shape, dtype), not in_memory, scale, block, region, direct,
                        piece_bytes)
