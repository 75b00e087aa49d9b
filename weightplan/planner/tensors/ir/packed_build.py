"""Packed formats in the graph: a ``DEQUANTIZE`` node per stored weight, before merges.

Routing sees each stored weight under its logical key and shape
(:meth:`~weightplan.planner.inputs.packed_pairs.PackedPairing.entry`), its parts hidden
(like FP8 scales). Building a conversion, each source whose key is a paired weight
becomes ``DEQUANTIZE(read(part) for part in scheme.roles)``: one node per expert, the op
chain's input in place of the read, landing straight in its destination slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from operator import attrgetter, is_, itemgetter

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.ops.base import Streams, stream_positions
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.packed_weight import PackedWeight, packed_weight
from weightplan.planner.keys.routing import Group
from weightplan.planner.tensors.ir.nodes import (
    DequantizeAttrs, Node, NodeKind, make_nodes, read_nodes,
)
from weightplan.planner.tensors.ir.quant_build import QuantContext, dequantized_dtype


def packed_source_streams(group: Group, quant: QuantContext | None, expected: object,
                          dtype: torch.dtype | None
                          ) -> tuple[Streams[Node], list[Node]] | None:
    """:func:`~weightplan.planner.tensors.ir.quant_build.source_streams` of a group with
    packed weights (``None``: it has none): each stream's packed sources behind their
    dequantize nodes, the rest plain reads."""
    pairing = quant.packed if quant is not None else None
    if pairing is None or not any(map(_IS_PACKED, chain.from_iterable(group.sources))):
        return None
    out = dequantized_dtype(group, expected, dtype)
    streams, reads, added = [], [], []
    for i, entries in enumerate(group.sources):
        made = packed_stream(entries, stream_positions(i, len(entries)), out)
        values = made[0] if made is not None else tuple(
            read_nodes(entries, stream_positions(i, len(entries))))
        streams.append(values)
        reads += made[1] if made is not None else list(values)
        added += made[2] if made is not None else []
    return tuple(streams), reads + added


def packed_stream(entries: Sequence[TensorEntry], sources: Sequence[tuple[int, int]],
                  dtype: torch.dtype
                  ) -> tuple[tuple[Node, ...], list[Node], list[Node]] | None:
    """``(values, reads, added)`` of a stream with packed weights (``None``: it has none):
    the values are the dequantize nodes (plain reads where a source isn't packed: a
    source is packed when it is a :class:`PackedWeight`, a pairing's logical entry). A
    stream of packed weights only, each with as many parts (a stack's experts: Kimi-K2's
    384), is made in columns (:func:`stacked_packed`); any other entry by entry
    (:func:`each_packed`). Either way the same nodes."""
    found = list(map(packed_weight, entries))  # (told by type: no key looked up)
    missing = list(map(is_, found, repeat(None)))  # (by identity: no __eq__ called)
    if all(missing):
        return None
    if not any(missing) and not any(map(is_, entries, map(_FIRST, map(_PARTS, found)))) \
            and len(set(map(len, map(_PARTS, found)))) == 1:  # (told in columns)
        return stacked_packed(found, sources, dtype)  # type: ignore[arg-type]
    packed = list(map(_dequantized, entries, found))
    if not any(packed):
        return None
    return each_packed(entries, packed, sources, dtype)


def _dequantized(entry: TensorEntry, weight: PackedWeight | None) -> PackedWeight | None:
    """``entry``'s packed weight, unless ``entry`` is that weight's own stored tensor (a
    role a model keeps as stored: a plain read)."""
    return None if weight is None or entry is weight.parts[0] else weight


def stacked_packed(packed: Sequence[PackedWeight], sources: Sequence[tuple[int, int]],
                   dtype: torch.dtype) -> tuple[tuple[Node, ...], list[Node], list[Node]]:
    """:func:`packed_stream` of packed weights with as many parts each, role by role: the
    read nodes of each part in one column, then the dequantize nodes in one."""
    roles = [read_nodes(column, sources) for column in zip(*map(_PARTS, packed), strict=True)]
    # one spec per logical spec object, one attrs object per scheme object (a stack's
    # weights share one of each: told by identity, no shape hashed per weight)
    logical, schemes = list(map(_SPEC, packed)), list(map(_SCHEME, packed))
    specs = {id(s): TensorSpec(s.shape, dtype) for s in dict(zip(map(id, logical), logical,
                                                                strict=True)).values()}
    attrs = {id(s): DequantizeAttrs(dtype, (), s) for s in dict(zip(map(id, schemes), schemes,
                                                                     strict=True)).values()}
    values = make_nodes(NodeKind.DEQUANTIZE, list(map(specs.__getitem__, map(id, logical))),
                        list(zip(*roles, strict=True)),
                        list(map(attrs.__getitem__, map(id, schemes))))
    return tuple(values), roles[0], [n for role in roles[1:] for n in role] + values


_PARTS, _FIRST = attrgetter("parts"), itemgetter(0)
_IS_PACKED = PackedWeight.__instancecheck__
_SPEC, _SCHEME = attrgetter("spec"), attrgetter("scheme")


def each_packed(entries: Sequence[TensorEntry], packed: Sequence[PackedWeight | None],
                sources: Sequence[tuple[int, int]], dtype: torch.dtype
                ) -> tuple[tuple[Node, ...], list[Node], list[Node]]:
    """:func:`packed_stream` entry by entry (a stream mixing packed and plain sources)."""
    values: list[Node] = []
    reads: list[Node] = []
    added: list[Node] = []
    for entry, weight, source in zip(entries, packed, sources, strict=True):
        if weight is None:
            node = read_nodes([entry], [source])[0]
            reads.append(node)
            values.append(node)
            continue
        parts = read_nodes(list(weight.parts), [source] * len(weight.parts))
        reads.append(parts[0])
        added += parts[1:]
        node = Node(NodeKind.DEQUANTIZE, TensorSpec(weight.shape, dtype), tuple(parts),
                    DequantizeAttrs(dtype, (), weight.scheme))
        added.append(node)
        values.append(node)
    return tuple(values), reads, added
