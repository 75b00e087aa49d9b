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
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.packed_pairs import PackedPairing
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, read_nodes


def routed_entries(ckpt: Checkpoint, pairing: PackedPairing | None) -> Checkpoint | None:
    """The checkpoint routing sees (``None``: unchanged): each stored weight under its
    logical key, in its place; its parts left out."""
    if pairing is None or not (pairing.weights or pairing.companions):
        return None
    from dataclasses import replace

    first_part = {w.parts[0].key: key for key, w in pairing.weights.items()}
    entries: dict[str, TensorEntry] = {}
    for key, entry in ckpt.entries.items():
        logical = first_part.get(key)
        if logical is not None:
            entries[logical] = pairing.entry(logical)
        elif key not in pairing.companions:
            entries[key] = entry
    return replace(ckpt, entries=entries)


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
        if packed is None:
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
