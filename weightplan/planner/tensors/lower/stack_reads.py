"""Whether a stream of reads is a stack's (the experts of a stack: every read of one
geometry, each landing in one fragment of one region), told in columns from its nodes and
fragments (:func:`stack_geometry`). Only a stream of several reads is asked; the read tasks
themselves are made in :mod:`~weightplan.planner.tensors.lower.read_tasks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, itemgetter

from weightplan.planner.core.geometry import Fragment, Region, StackFragments
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind


def stack_geometry(stream: tuple[Node, ...], frags: tuple[tuple[Fragment, ...], ...]
                   ) -> tuple[tuple, list[TensorEntry], Sequence[Fragment], Region, int] | None:
    """What every read of ``stream`` shares when it is a stack's, told in columns: each
    read of the same entry spec, placement (file or memory), contiguity and, for
    dequantizes, scale spec and attrs (packed ones: every part's spec); each landing in exactly one fragment, all of one
    region, view shape, stride and target (as a stack's are: :class:`StackFragments`
    says so without looking). Returns the geometry's parts up to the destination dtype
    (the first arguments of :func:`~weightplan.planner.tensors.lower.read_tasks.read_geometry`),
    the entries read, the fragments, their region and target; ``None``: not so (read by read,
    then)."""
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
    :func:`~weightplan.planner.tensors.lower.read_tasks.read_parts`. Packed dequantizes:
    :func:`_alike_packed`."""
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
    parts are :data:`PACKED` and the part specs (a packed read's layout is its parts'
    boxes: :func:`~weightplan.planner.tensors.lower.read_tasks.packed_layout` of the first
    node, for all). The entries read are the stored weights'."""
    if not (_same(list(map(_SPEC, stream))) and _same(list(map(len, inputs)))):
        return None
    roles = [list(map(_ENTRY, column)) for column in zip(*inputs, strict=True)]
    specs = [list(map(_SPEC, column)) for column in roles]
    if not all(map(_same, specs)) or list(map(_FILE, roles[0])).count(None) not in (
            0, len(stream)):
        return None
    return (PACKED, *[column[0] for column in specs]), roles[0]


PACKED = object()  # (the parts of a packed stack: see _alike_packed)


def _same(column: Sequence[object]) -> bool:
    """Every item of a non-empty ``column`` equals the first (compared by identity first)."""
    return column.count(column[0]) == len(column)


_REGION, _VIEW, _TARGET = attrgetter("region"), attrgetter("view"), attrgetter("target")
_SHAPE, _STRIDE = attrgetter("shape"), attrgetter("stride")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_KIND, _ATTRS, _INPUTS = attrgetter("kind"), attrgetter("attrs"), attrgetter("inputs")
_ENTRY, _ENTRY_SPEC = attrgetter("attrs.entry"), attrgetter("attrs.entry.spec")
_SPEC, _FILE = attrgetter("spec"), attrgetter("file")
