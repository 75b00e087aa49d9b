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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.core.makers import columns, fill, slot_setters
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import Region
from weightplan.planner.core.ops.base import ConversionOp, Streams, stream_positions
from weightplan.planner.core.spec import TensorSpec, short_dtype

if TYPE_CHECKING:  # (tensor parallelism's: imported where a plan shards)
    from weightplan.planner.core.sharding.placements import Placement


class NodeKind(Enum):
    READ = "read"  # a checkpoint tensor (its byte range in a file, or an in-memory tensor)
    OP = "op"  # one output of a conversion op
    CAST = "cast"  # a dtype change on the way to the sink
    DEQUANTIZE = "dequantize"  # quantized weight + scale → floating tensor
    QUANTIZE = "quantize"  # floating tensor → quantized weight (its scale is a sibling node)
    SHARD = "shard"  # the region of a tensor one rank keeps
    SINK = "sink"  # lands in a destination: a model tensor, an output-file tensor, memory

    # members are singletons; Enum's hash hashes the name in Python, and every node's hash
    # hashes its kind: ~0.02 s of explain() on DeepSeek-V3 FP8 (2%)
    __hash__ = object.__hash__


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
    """Input: a floating tensor. ``scale``: True for the scale output, False for the weight.
    ``exact``: a lossless re-encode (power-of-two float32 scales; an inexact tile is an
    error), see :mod:`~weightplan.planner.core.quant.quantize`."""

    dtype: torch.dtype
    block: tuple[int, ...]
    scale: bool
    exact: bool = False


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
    """One tensor value in the plan. Made by ``Node(kind, spec, inputs, attrs)``, or a
    stream at a time by :func:`make_nodes` (the same nodes, the same hashes)."""

    kind: NodeKind
    spec: TensorSpec
    inputs: tuple["Node", ...]
    attrs: Attrs
    _hash: int = field(init=False, repr=False, compare=False)

    def __init__(self, kind: NodeKind, spec: TensorSpec, inputs: tuple["Node", ...],
                 attrs: Attrs) -> None:
        # (the slots written through their descriptors, past the frozen __setattr__)
        _set_kind(self, kind)
        _set_spec(self, spec)
        _set_inputs(self, inputs)
        _set_attrs(self, attrs)
        # (what _hashes computes, for one node: no columns to set up)
        _set_hash(self, hash((kind, inputs, _IDENTITY.get(type(attrs), _itself)(attrs))))

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


def make_nodes(kind: NodeKind, specs: Iterable[TensorSpec], inputs: Sequence[tuple[Node, ...]],
               attrs: Sequence[Attrs]) -> list[Node]:
    """``Node(kind, spec, inputs, attrs)`` for each row of the columns (``attrs`` all of
    one class). Many at once (a stack's 256 experts), every slot is written for all of them
    in one C-level pass: ~0.6 µs a node instead of ~1.9 µs; a few, one by one (quicker
    than setting up the columns)."""
    if len(attrs) < _FEW:
        return list(map(Node, repeat(kind), specs, inputs, attrs))
    made: list[Node] = list(map(_NEW, repeat(Node, len(attrs))))
    fill(made, _SETTERS, (repeat(kind), specs, inputs, attrs, _hashes(kind, inputs, attrs)))
    return made


_FEW = 4


def _hashes(kind: NodeKind, inputs: Iterable[tuple[Node, ...]], attrs: Sequence[Attrs]
            ) -> Iterator[int]:
    """The hash of each node of ``kind`` with these ``inputs`` and ``attrs`` (all of one
    class): the one definition of a node's hash, computed once, when it is made. It hashes
    the kind, the inputs (their hashes: read from their slots by ``Node.__hash__``) and
    what tells attrs apart when the inputs are equal (:data:`_IDENTITY`)."""
    identity = _IDENTITY.get(type(attrs[0]), _itself) if attrs else _itself
    return map(hash, zip(repeat(kind), inputs, map(identity, attrs), strict=False))


# What tells the attrs of nodes with equal inputs apart (equal attrs have equal ones),
# cheap to hash: a read's checkpoint key (not its entry), an op output's stage and
# position, a sink's target (not its destination), a dequantize's block (its weight and
# scale tell it apart); the attrs of other kinds, small and few, whole.
_IDENTITY: dict[type, Callable[[Any], object]] = {
    ReadAttrs: attrgetter("entry.key"), OpAttrs: attrgetter("stage", "position"),
    SinkAttrs: attrgetter("dest.key"), DequantizeAttrs: attrgetter("block")}


def _itself(attrs: object) -> object:
    return attrs


_SETTERS = slot_setters(Node, ("kind", "spec", "inputs", "attrs", "_hash"))
_set_kind, _set_spec, _set_inputs, _set_attrs, _set_hash = _SETTERS
_NEW = object.__new__
_read_attrs = columns(ReadAttrs)
_READ = NodeKind.READ


def read_nodes(entries: Sequence[TensorEntry], sources: Sequence[tuple[int, int]]) -> list[Node]:
    """``Node(READ, e.spec, (), ReadAttrs(e, source))`` for each entry and source (a few
    made one by one: the columns' iterators cost more than they save)."""
    count = len(entries)
    if count < _FEW:
        return [Node(_READ, e.spec, (), ReadAttrs(e, s)) for e, s in zip(entries, sources, strict=False)]
    return make_nodes(_READ, map(_SPEC, entries), [()] * count,
                      _read_attrs(count, entries, sources))


_SPEC = attrgetter("spec")


def read_streams(sources: Sequence[Sequence[TensorEntry]]) -> tuple[Streams[Node], list[Node]]:
    """A plain conversion's inputs: a read per source, by stream; and those reads in order."""
    if len(sources) == 1:  # (one stream, as a plain key's: its row is every read)
        row = read_nodes(sources[0], stream_positions(0, len(sources[0])))
        return (tuple(row),), row
    rows = [read_nodes(entries, stream_positions(i, len(entries)))
            for i, entries in enumerate(sources)]
    return tuple(map(tuple, rows)), [n for row in rows for n in row]


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
