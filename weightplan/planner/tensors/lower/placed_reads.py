"""The read tasks of a step's placed sources: each stream's reads, a task per fragment it
lands in; a stream whose reads share one geometry (the experts of a stack) computed once
for all (:func:`placed_reads`). The tasks themselves: :mod:`~weightplan.planner.tensors.lower.read_tasks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import compress, repeat
from typing import TYPE_CHECKING
from operator import attrgetter, itemgetter

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.core.makers import columns
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import (
    CACHE_SIZE, Fragment, Region, StackFragments, _is_contiguous,
)
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, read_attrs
from weightplan.planner.core.ops.base import Streams
from weightplan.planner.core.spec import TensorSpec

if TYPE_CHECKING:  # (a packed format's reads: imported where a plan has one; strided reads)
    pass
from weightplan.planner.tensors.lower.read_tasks import (
    ReadLayout, ReadTask, packed_layout, read_parts, task_layout,
)


def placed_reads(sources: Streams[Node], frags: Streams[tuple[Fragment, ...]],
                 dests: tuple[Destination, ...], piece_bytes: int) -> tuple[ReadTask, ...]:
    """A read task for each non-empty fragment each source lands in, with the layout of
    its geometry (:func:`_geometry`). A stream whose reads all share one geometry (a
    stack: :func:`_stack_geometry` says so from the nodes and fragments, in columns; a
    packed stack's layout is its parts' boxes) is made in columns with that one layout;
    any other read by read. Either way, the same
    tasks. Items landing nowhere (another rank's experts) are left out first, so that a
    rank's experts of a stack are made in columns too."""
    tasks: list[ReadTask] = []
    dtypes = [d.spec.dtype for d in dests]
    for stream, placed in zip(sources, frags, strict=True):
        if len(stream) >= _STACK and not all(placed):  # (expert parallel)
            kept = list(map(bool, placed))
            stream, placed = tuple(compress(stream, kept)), tuple(compress(placed, kept))
        stack = _stack_geometry(stream, placed) if len(stream) >= _STACK else None
        if stack is None:
            _each_read(tasks, stream, placed, dtypes, piece_bytes)
            continue
        parts, entries, landed, region, target = stack
        if parts[0] is _PACKED:  # (one box per part, whatever the destination's dtype)
            layout = packed_layout(stream[0], region) if region.numel else None
        else:
            layout = _geometry(*parts, dtypes[target], piece_bytes)
        if layout is not None:
            tasks += _tasks(len(stream), stream, entries, repeat(region), landed, repeat(layout))
    return tuple(tasks)


_STACK = 8  # fewer reads in a stream: telling whether they are alike costs what it saves


def _each_read(tasks: list[ReadTask], stream: tuple[Node, ...],
               frags: tuple[tuple[Fragment, ...], ...], dtypes: list[torch.dtype],
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
                   dtypes[f.target], piece_bytes)
            if key != last:
                last, layout = key, _geometry(*key)
            if layout is not None:
                tasks.append(ReadTask(node, entry, f.region, f, layout))


_tasks = columns(ReadTask)  # (~45k tasks in a DeepSeek-V3 plan)


def _stack_geometry(stream: tuple[Node, ...], frags: tuple[tuple[Fragment, ...], ...]
                    ) -> tuple[tuple, list[TensorEntry], Sequence[Fragment], Region, int] | None:
    """What every read of ``stream`` shares when it is a stack's, told in columns: each
    read of the same entry spec, placement (file or memory), contiguity and, for
    dequantizes, scale spec and attrs (packed ones: every part's spec); each landing in exactly one fragment, all of one
    region, view shape, stride and target (as a stack's are: :class:`StackFragments`
    says so without looking). Returns the geometry's parts up to the destination dtype
    (:func:`_geometry`'s first arguments), the entries read, the fragments, their region
    and target; ``None``: not so (read by read, then)."""
    n = len(stream)
    stacked = isinstance(frags, StackFragments) and len(frags) == n
    if not stacked and list(map(len, frags)).count(1) != n:
        return None
    alike = _alike_reads(stream)
    if alike is None:
        return None
    parts, entries = alike
    if isinstance(frags, StackFragments) and stacked:
        return (*parts, frags.region, frags.shape, frags.stride), entries, frags.fragments, \
            frags.region, frags.target
    fs = list(map(_FIRST, frags))
    regions, views, targets = list(map(_REGION, fs)), list(map(_VIEW, fs)), list(map(_TARGET, fs))
    shapes, strides = list(map(_SHAPE, views)), list(map(_STRIDE, views))
    if not (_same(regions) and _same(shapes) and _same(strides) and _same(targets)):
        return None
    return (*parts, regions[0], shapes[0], strides[0]), entries, fs, regions[0], targets[0]


def _alike_reads(stream: tuple[Node, ...]) -> tuple[tuple, list[TensorEntry]] | None:
    """The entry spec's shape and dtype, whether in memory, whether contiguous, and the
    scale spec's shape, dtype and block (``None`` unless dequantized) that every node of
    ``stream`` reads with, and the entries it reads (``None``: they differ). Node by node:
    :func:`_read_parts`. Packed dequantizes: :func:`_alike_packed`."""
    kinds = list(map(_KIND, stream))
    kind = kinds[0]
    if kinds.count(kind) != len(kinds):
        return None
    scale: tuple = (None, None, None)
    if kind is NodeKind.DEQUANTIZE:
        attrs = list(map(_ATTRS, stream))  # (a stack's share one object: compared by identity)
        if not _same(attrs) or not isinstance(attrs[0], DequantizeAttrs):
            return None
        inputs = list(map(_INPUTS, stream))
        if attrs[0].scheme is not None:
            return _alike_packed(stream, inputs)
        scales = list(map(_ENTRY_SPEC, map(_SECOND, inputs)))
        if not _same(scales):
            return None
        scale = (scales[0].shape, scales[0].dtype, attrs[0].block)
        stream = tuple(map(_FIRST, inputs))
    entries = list(map(_ENTRY, stream))
    # one spec, and one class of entry: one contiguity (a StridedEntry's is False)
    specs, classes, files = list(map(_SPEC, entries)), list(map(type, entries)), \
        list(map(_FILE, entries))
    memory = files.count(None)
    if not (_same(specs) and _same(classes) and memory in (0, len(files))):
        return None
    spec = specs[0]
    return (spec.shape, spec.dtype, memory > 0, entries[0].contiguous, *scale), entries


def _alike_packed(stream: tuple[Node, ...], inputs: list[tuple[Node, ...]]
                  ) -> tuple[tuple, list[TensorEntry]] | None:
    """:func:`_alike_reads` of packed dequantizes (of one attrs object): one logical spec,
    each part (role) of one spec, the stored weights all in files or all in memory; the
    parts are :data:`_PACKED` and the part specs (a packed read's layout is its parts'
    boxes: :func:`~weightplan.planner.tensors.lower.read_tasks.packed_layout` of the first
    node, for all). The entries read are the stored weights'."""
    if not (_same(list(map(_SPEC, stream))) and _same(list(map(len, inputs)))):
        return None
    roles = [list(map(_ENTRY, column)) for column in zip(*inputs, strict=True)]
    specs = [list(map(_SPEC, column)) for column in roles]
    if not all(map(_same, specs)) or list(map(_FILE, roles[0])).count(None) not in (
            0, len(stream)):
        return None
    return (_PACKED, *[column[0] for column in specs]), roles[0]


_PACKED = object()  # (the parts of a packed stack: see _alike_packed)


def _same(column: Sequence[object]) -> bool:
    """Every item of a non-empty ``column`` equals the first (compared by identity first)."""
    return column.count(column[0]) == len(column)


_REGION, _VIEW, _TARGET = attrgetter("region"), attrgetter("view"), attrgetter("target")
_SHAPE, _STRIDE = attrgetter("shape"), attrgetter("stride")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_KIND, _ATTRS, _INPUTS = attrgetter("kind"), attrgetter("attrs"), attrgetter("inputs")
_ENTRY, _ENTRY_SPEC = attrgetter("attrs.entry"), attrgetter("attrs.entry.spec")
_SPEC, _FILE = attrgetter("spec"), attrgetter("file")


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
    return task_layout(TensorSpec(shape, dtype), not in_memory, scale, block, region, direct,
                        piece_bytes)
