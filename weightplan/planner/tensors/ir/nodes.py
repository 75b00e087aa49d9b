"""Graph nodes: frozen, hashable, one tensor value each, with ordered inputs.

A conversion is ``read → op … → (cast) → sink``; the kinds the quantization and
tensor-parallel work add (dequantize, quantize, shard) sit between reads and sinks the
same way. Node kinds form a closed enum, and what a node does is in its kind's typed
``attrs`` dataclass (:data:`ATTRS_OF` pins which). Equal subgraphs are equal nodes
(identity is structure); the hash is computed once. An edge is an input of a node: it
carries the input's :class:`TensorSpec` (shape, dtype), and the region of the input the
node reads (the whole tensor unless a shard narrows it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from operator import attrgetter

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.core.makers import filled
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import Region
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.core.spec import TensorSpec, short_dtype


class NodeKind(Enum):
    READ = "read"  # a checkpoint tensor (its byte range in a file, or an in-memory tensor)
    OP = "op"  # one output of a conversion op
    CAST = "cast"  # a dtype change on the way to the sink
    DEQUANTIZE = "dequantize"  # quantized weight + scale → floating tensor
    QUANTIZE = "quantize"  # floating tensor → quantized weight (its scale is a sibling node)
    SHARD = "shard"  # the region of a tensor one rank keeps
    SINK = "sink"  # lands in a destination: a model tensor, an output-file tensor, memory

    __hash__ = object.__hash__  # members are singletons; Enum's hashes the name in Python


@dataclass(frozen=True, slots=True)
class ReadAttrs:
    entry: TensorEntry
    source: tuple[int, int]  # (stream, index) among the conversion's sources


@dataclass(frozen=True, slots=True)
class OpAttrs:
    op: ConversionOp
    stage: int  # position of the op in its converter's chain
    position: tuple[int, int]  # (stream, index) of this output


@dataclass(frozen=True, slots=True)
class CastAttrs:
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class DequantizeAttrs:
    """Inputs: (weight, scale). ``block``: elements per scale along each dim. A packed
    format (``scheme``, a :class:`~weightplan.planner.core.quant.formats.Scheme`) takes
    its stored parts in ``scheme.roles`` order instead, and yields the logical shape."""

    dtype: torch.dtype
    block: tuple[int, ...]
    scheme: object = None


@dataclass(frozen=True, slots=True)
class QuantizeAttrs:
    """Input: a floating tensor. ``scale``: True for the scale output, False for the weight."""

    dtype: torch.dtype
    block: tuple[int, ...]
    scale: bool


@dataclass(frozen=True, slots=True)
class ShardAttrs:
    """The part of the input that ``rank`` of ``world_size`` keeps under ``placement``:
    the boxes ``pieces`` of the input, concatenated in order along the placement's dim
    (one box for ``Shard``, one per block for ``_StridedShard``)."""

    placement: Placement
    pieces: tuple[Region, ...]
    rank: int
    world_size: int

    @property
    def local_shape(self) -> tuple[int, ...]:
        first = self.pieces[0].shape
        if len(self.pieces) == 1:
            return first
        d = self.placement.axis
        return first[:d] + (sum(p.shape[d] for p in self.pieces),) + first[d + 1:]


@dataclass(frozen=True, slots=True)
class SinkAttrs:
    dest: Destination

    @property
    def target(self) -> str:
        return self.dest.key


Attrs = (ReadAttrs | OpAttrs | CastAttrs | DequantizeAttrs | QuantizeAttrs | ShardAttrs
         | SinkAttrs)

ATTRS_OF: dict[NodeKind, type] = {
    NodeKind.READ: ReadAttrs, NodeKind.OP: OpAttrs, NodeKind.CAST: CastAttrs,
    NodeKind.DEQUANTIZE: DequantizeAttrs, NodeKind.QUANTIZE: QuantizeAttrs,
    NodeKind.SHARD: ShardAttrs, NodeKind.SINK: SinkAttrs,
}


@dataclass(frozen=True, eq=True, slots=True, init=False)
class Node:
    """One tensor value in the plan."""

    kind: NodeKind
    spec: TensorSpec
    inputs: tuple["Node", ...]
    attrs: Attrs
    _hash: int = field(init=False, repr=False, compare=False)

    def __init__(self, kind: NodeKind, spec: TensorSpec, inputs: tuple["Node", ...],
                 attrs: Attrs) -> None:
        # a frontier plan makes ~140k nodes: the slots are written straight through their
        # descriptors (the frozen class's generated __init__ goes through object.__setattr__)
        _set_kind(self, kind)
        _set_spec(self, spec)
        _set_inputs(self, inputs)
        _set_attrs(self, attrs)
        # (an input's hash read straight from its slot: a merge has 256 inputs)
        _set_hash(self, hash((kind, tuple(map(_HASH, inputs)), *_identity(attrs))))

    def __hash__(self) -> int:
        return self._hash

    @property
    def label(self) -> str:
        a = self.attrs
        if isinstance(a, ReadAttrs):
            return a.entry.key
        if isinstance(a, OpAttrs):
            return repr(a.op)
        if isinstance(a, (CastAttrs, DequantizeAttrs, QuantizeAttrs)):
            return f"{self.kind.value} → {short_dtype(a.dtype)}"
        if isinstance(a, ShardAttrs):
            return f"shard {a.placement} rank {a.rank}/{a.world_size}"
        return a.dest.key

    def __repr__(self) -> str:
        return f"<{self.kind.value} {self.label} {self.spec}>"


_set_kind, _set_spec, _set_inputs, _set_attrs, _set_hash = (
    getattr(Node, name).__set__ for name in ("kind", "spec", "inputs", "attrs", "_hash"))
_set_entry, _set_source = (getattr(ReadAttrs, name).__set__ for name in ("entry", "source"))
_KEY, _SPEC, _HASH = attrgetter("key"), attrgetter("spec"), attrgetter("_hash")


_FEW = 4  # up to this many nodes, the exact constructor beats bulk filling's setup


def read_nodes(entries: Sequence[TensorEntry], sources: Sequence[tuple[int, int]]) -> list[Node]:
    """``Node(READ, e.spec, (), ReadAttrs(e, source))`` for each entry and source, made in
    bulk (an FP8 stack has 256 experts per stream); a few, one by one (cheaper there)."""
    count = len(entries)
    if count <= _FEW:
        return [Node(NodeKind.READ, e.spec, (), ReadAttrs(e, s))
                for e, s in zip(entries, sources, strict=True)]
    attrs = filled(ReadAttrs, count, ((_set_entry, entries), (_set_source, sources)))
    hashes = map(hash, zip(repeat(NodeKind.READ), repeat(()), map(_KEY, entries), sources))
    return filled(Node, count, ((_set_kind, repeat(NodeKind.READ)), (_set_spec, map(_SPEC, entries)),
                                (_set_inputs, repeat(())), (_set_attrs, attrs), (_set_hash, hashes)))


def dequantize_nodes(weights: Sequence[Node], scales: Sequence[Node], specs: Iterable[TensorSpec],
                     attrs: Sequence[DequantizeAttrs]) -> list[Node]:
    """``Node(DEQUANTIZE, spec, (weight, scale), attrs)`` for each, made in bulk."""
    count = len(weights)
    kind = NodeKind.DEQUANTIZE
    inputs = list(zip(weights, scales, strict=True))
    hashes = map(hash, zip(repeat(kind), zip(map(_HASH, weights), map(_HASH, scales), strict=True),
                           map(_DTYPE, attrs), map(_BLOCK, attrs)))
    return filled(Node, count, ((_set_kind, repeat(kind)), (_set_spec, specs),
                               (_set_inputs, inputs), (_set_attrs, attrs), (_set_hash, hashes)))


def dequantize_stack(weights: Sequence[Node], scales: Sequence[Node], spec: TensorSpec,
                     attrs: DequantizeAttrs) -> list[Node]:
    """``Node(DEQUANTIZE, spec, (weight, scale), attrs)`` for each (one spec and attrs for
    all: a stack of experts), made in bulk (a few: one by one)."""
    kind = NodeKind.DEQUANTIZE
    if len(weights) <= _FEW:
        return [Node(kind, spec, pair, attrs) for pair in zip(weights, scales, strict=True)]
    inputs = list(zip(weights, scales, strict=True))
    hashes = map(hash, zip(repeat(kind), zip(map(_HASH, weights), map(_HASH, scales),
                                             strict=True), repeat(attrs.dtype), repeat(attrs.block)))
    return filled(Node, len(inputs), ((_set_kind, repeat(kind)), (_set_spec, repeat(spec)),
                                      (_set_inputs, inputs), (_set_attrs, repeat(attrs)),
                                      (_set_hash, hashes)))


_DTYPE, _BLOCK = attrgetter("dtype"), attrgetter("block")


def _identity(a: Attrs) -> tuple:
    """Fields that tell nodes apart (equal nodes have equal ones), cheap to hash: the
    checkpoint key rather than the whole entry, a sink's target rather than its
    destination; the hash of 140k nodes is then a small part of planning. With the
    inputs' own hashes, these make a node's hash (:func:`read_nodes` and
    :func:`dequantize_nodes` compute the same ones in bulk)."""
    if isinstance(a, ReadAttrs):
        return a.entry.key, a.source
    if isinstance(a, OpAttrs):
        return a.stage, a.position
    if isinstance(a, SinkAttrs):
        return (a.dest.key,)
    if isinstance(a, DequantizeAttrs):
        return a.dtype, a.block
    return (a,)


def read_attrs(node: Node) -> ReadAttrs:
    """The attrs of a READ node (narrowed for the type checker)."""
    assert isinstance(node.attrs, ReadAttrs), node
    return node.attrs


def op_attrs(node: Node) -> OpAttrs:
    assert isinstance(node.attrs, OpAttrs), node
    return node.attrs


def cast_attrs(node: Node) -> CastAttrs:
    assert isinstance(node.attrs, CastAttrs), node
    return node.attrs


def sink_attrs(node: Node) -> SinkAttrs:
    assert isinstance(node.attrs, SinkAttrs), node
    return node.attrs
