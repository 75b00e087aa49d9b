"""Packed formats in the graph: a ``DEQUANTIZE`` node per stored weight, before merges.

Routing sees each stored weight under its logical key and shape
(:meth:`~weightplan.planner.inputs.packed_pairs.PackedPairing.entry`), its parts hidden
(like FP8 scales). Building a conversion, each source whose key is a paired weight
becomes ``DEQUANTIZE(read(part) for part in scheme.roles)``: one node per expert, the op
chain's input in place of the read, landing straight in its destination slice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.ops.base import Streams, stream_positions
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.packed_pairs import PackedPairing
from weightplan.planner.keys.routing import Group
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, read_nodes
from weightplan.planner.tensors.ir.quant_build import QuantContext, dequantized_dtype


def packed_source_streams(group: Group, quant: QuantContext | None, expected: object,
                          dtype: torch.dtype | None
                          ) -> tuple[Streams[Node], list[Node]] | None:
    """:func:`~weightplan.planner.tensors.ir.quant_build.source_streams` of a group with
    packed weights (``None``: it has none): each stream's packed sources behind their
    dequantize nodes, the rest plain reads."""
    pairing = quant.packed if quant is not None else None
    if pairing is None or not any(e.key in pairing.weights for s in group.sources for e in s):
        return None
    out = dequantized_dtype(group, expected, dtype)
    streams, reads, added = [], [], []
    for i, entries in enumerate(group.sources):
        made = packed_stream(entries, stream_positions(i, len(entries)), pairing, out)
        values = made[0] if made is not None else tuple(
            read_nodes(entries, stream_positions(i, len(entries))))
        streams.append(values)
        reads += made[1] if made is not None else list(values)
        added += made[2] if made is not None else []
    return tuple(streams), reads + added


def packed_stream(entries: Sequence[TensorEntry], sources: Sequence[tuple[int, int]],
                  pairing: PackedPairing, dtype: torch.dtype
                  ) -> tuple[tuple[Node, ...], list[Node], list[Node]] | None:
    """``(values, reads, added)`` of a stream with packed weights (``None``: it has none):
    the values are the dequantize nodes (plain reads where a source isn't packed)."""
    weights = pairing.weights
    if not any(e.key in weights for e in entries):
        return None
    values: list[Node] = []
    reads: list[Node] = []
    added: list[Node] = []
    for entry, source in zip(entries, sources, strict=True):
        packed = weights.get(entry.key)
        if packed is None or entry is packed.parts[0]:  # (a kept role's own stored tensor)
            node = read_nodes([entry], [source])[0]
            reads.append(node)
            values.append(node)
            continue
        parts = read_nodes(list(packed.parts), [source] * len(packed.parts))
        reads.append(parts[0])
        added += parts[1:]
        node = Node(NodeKind.DEQUANTIZE, TensorSpec(packed.shape, dtype), tuple(parts),
                    DequantizeAttrs(dtype, (), packed.scheme))
        added.append(node)
        values.append(node)
    return tuple(values), reads, added
