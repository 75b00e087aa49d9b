"""Where every byte lands: lower one conversion of the graph into a :class:`Step`.

Starting from the sink nodes (each a full view of a model tensor, an output-file tensor
or a returned tensor), fragments are pushed backwards through the op nodes, stage by
stage, with ``ConversionOp.place``. When every op places, each read node's bytes go
straight into the slice of the destination a merge/concat/chunk would put them in: no
intermediate at all. An op that can't place but updates its output in place (a LoRA
merge, ``ConversionOp.place_kept``) is lowered like a placed one for the inputs it keeps:
they are read straight into the destination, the others are held, and the op then
finishes the destination where it lies (``Step.in_place``). A read is *direct* (a plain
byte copy) when its destination view is contiguous, the dtype needs no cast and the source
region is one contiguous byte range; otherwise it is a strided (and casting) copy. When
an op can't place, the op nodes up to it run on materialized tensors and their outputs are
copied into the placed views. An output-file destination written by anything but direct copies is *staged*: assembled in
memory, written once. Everything here is derived from the graph's nodes; the step keeps
the nodes it runs, and :mod:`~weightplan.planner.tensors.verify.verify` checks it. The reads
themselves (byte ranges, pieces, windows) are :mod:`~weightplan.planner.tensors.lower.read_tasks`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, replace
from functools import cache, lru_cache
from itertools import chain, compress, filterfalse, repeat
from operator import attrgetter, is_
from types import ModuleType
from typing import TYPE_CHECKING

from weightplan.errors import PlanError
from weightplan.planner.core.makers import slot_setters
from weightplan.planner.tensors.ir.build import Conversion, stages
from weightplan.planner.tensors.ir.stages import dense_sources, stage_op, stage_specs
from weightplan.planner.tensors.ir.destination import ALLOCATED, Destination, DestKind
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.tensors.ir.nodes import Node, NodeKind
from weightplan.planner.core.ops.base import ConversionOp, Streams
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.lower.read_tasks import (
    PIECE_BYTES, ReadTask, placed_reads, read_task,
)

if TYPE_CHECKING:
    from weightplan.planner.tensors.lower.quant_steps import QuantizeTask

_REQUESTED, _WINDOW_BYTES = attrgetter("layout.requested"), attrgetter("layout.window_bytes")
_TMP_BYTES, _FRAGMENT, _KIND = attrgetter("tmp_bytes"), attrgetter("fragment"), attrgetter("kind")
_DEST, _DEST_KIND = attrgetter("attrs.dest"), attrgetter("kind")
_NONE: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True, init=False)
class Step:
    """One conversion of the graph, lowered: what the executor does for it.

    Its byte counts are computed with it (every schedule reads them for every step; a
    slotted step holds no per-instance dict: a plan of 1M one-key steps is 400 MB lighter).
    Its slots are written through their descriptors (past the frozen ``__setattr__``):
    half the cost of a dataclass ``__init__``'s ``object.__setattr__`` per field.
    """

    label: str
    sinks: tuple[Node, ...]  # every sink of the conversion (DISCARD ones included)
    destinations: tuple[Destination, ...]  # the written sinks' destinations, by fragment target
    reads: tuple[ReadTask, ...]
    sources: Streams[Node]  # the READ nodes by source position (inputs of materialized ops)
    materialize: tuple[Streams[Node], ...]  # op-node stages run on tensors (empty: all placed)
    outputs: Streams[tuple[Fragment, ...]]  # where the last materialized stage's outputs land
    quantized: tuple[QuantizeTask, ...] = ()  # values quantized into FP8 weight + scale
    device_dequantize: frozenset[int] = _NONE  # destinations dequantized on their device
    in_place: bool = False  # the one materialized op updates ``outputs`` where its reads landed
    offloaded: frozenset[int] = _NONE  # destinations written to the disk: never resident
    offload_staged: frozenset[int] = _NONE  # of those, assembled in host memory first
    read_bytes: int = field(init=False)  # (spans, or only their runs: strided.py)
    dest_bytes: int = field(init=False)  # allocated and resident (0 when writing in place or to disk)
    staged_bytes: int = field(init=False)  # output tensors assembled until finalized (then written)
    held_bytes: int = field(init=False)  # temporaries kept until the materialized ops run
    convert_bytes: int = field(init=False)  # upper bound of what the materialized ops allocate

    def __init__(self, label: str, sinks: tuple[Node, ...],
                 destinations: tuple[Destination, ...], reads: tuple[ReadTask, ...],
                 sources: Streams[Node], materialize: tuple[Streams[Node], ...],
                 outputs: Streams[tuple[Fragment, ...]], quantized: tuple[QuantizeTask, ...] = (),
                 device_dequantize: frozenset[int] = _NONE, in_place: bool = False,
                 offloaded: frozenset[int] = _NONE, offload_staged: frozenset[int] = _NONE
                 ) -> None:
        _set_label(self, label)
        _set_sinks(self, sinks)
        _set_destinations(self, destinations)
        _set_reads(self, reads)
        _set_sources(self, sources)
        _set_materialize(self, materialize)
        _set_outputs(self, outputs)
        _set_quantized(self, quantized)
        _set_device_dequantize(self, device_dequantize)
        _set_in_place(self, in_place)
        _set_offloaded(self, offloaded)
        _set_offload_staged(self, offload_staged)
        self._count_bytes()

    def _count_bytes(self) -> None:
        reads = self.reads
        allocated = staged = 0
        dests = self.destinations
        if self.offloaded:  # (disk offload: held until written when staged, else not at all)
            staged = sum(dests[i].spec.nbytes for i in self.offload_staged)
            dests = tuple(d for i, d in enumerate(dests) if i not in self.offloaded)
        for d in dests:
            if d.kind in ALLOCATED:  # (Destination.allocates, inline)
                allocated += d.spec.nbytes
            if d.staged:
                staged += d.spec.nbytes
        _set_read_bytes(self, sum(map(_REQUESTED, reads)))
        _set_dest_bytes(self, allocated)
        _set_staged_bytes(self, staged)
        _set_held_bytes(self, sum(map(_TMP_BYTES, filterfalse(_FRAGMENT, reads))))  # (placed: 0)
        ops = 0
        if self.in_place:  # (the outputs are the destinations: nothing allocated for them)
            for stage in self.materialize:
                ops += stage_op(stage).update_bytes()
        else:
            for stage in self.materialize:  # (none when every op places)
                op = stage_op(stage)
                if op.allocates:
                    ops += sum(n.spec.nbytes for stream in stage for n in stream)
                ops += op.workspace_bytes()
        if self.quantized:
            ops += sum(t.work_bytes for t in self.quantized)
        _set_convert_bytes(self, ops)

    @property
    def ops(self) -> tuple[ConversionOp, ...]:
        """The materialized ops, in order."""
        return tuple(stage_op(stage) for stage in self.materialize)

    @property
    def needed_bytes(self) -> int:
        """The bytes of the regions read (a dequantize's scale tiles included)."""
        return sum(r.needed_bytes for r in self.reads)

    def window_counts(self) -> dict[int, int]:
        """Mapped file windows of the reads, by size, each live only while its read runs."""
        if len(self.reads) == 1:  # (a plain key's step)
            size = self.reads[0].layout.window_bytes
            return {size: 1} if size else {}
        sizes = list(filter(None, map(_WINDOW_BYTES, self.reads)))
        if not sizes or sizes.count(sizes[0]) == len(sizes):  # (one size: a lone read, a stack)
            return {sizes[0]: len(sizes)} if sizes else {}
        return Counter(sizes)


(_set_label, _set_sinks, _set_destinations, _set_reads, _set_sources, _set_materialize,
 _set_outputs, _set_quantized, _set_device_dequantize, _set_in_place, _set_offloaded,
 _set_offload_staged, _set_read_bytes, _set_dest_bytes, _set_staged_bytes, _set_held_bytes,
 _set_convert_bytes) = slot_setters(Step, [f.name for f in fields(Step)])


# a conversion's stages, and the specs of its op inputs (every stage but the last)
Front = tuple[tuple[Streams[Node], ...], tuple[Streams[TensorSpec], ...]]
_STAGED = frozenset((NodeKind.READ, NodeKind.DEQUANTIZE, NodeKind.OP))  # (what stages read)


class Fronts:
    """Each conversion's stages and their specs, shared by the conversions of one group
    whose stage nodes are the same objects (ranks planned together: each keeps its own
    tail, shard nodes and sinks, behind the front every rank shares)."""

    def __init__(self) -> None:
        # id(group) → (the conversion lowered first, its stage nodes, its front)
        self._by_group: dict[int, tuple[Conversion, tuple[Node, ...], Front]] = {}

    def of(self, conv: Conversion, kinds: list[NodeKind]) -> Front:
        hit = self._by_group.get(id(conv.group))
        if hit is not None and hit[0].group is conv.group and \
                _same_front(hit[1], conv.nodes, kinds):
            return hit[2]
        front = _front(conv, kinds)
        cut = len(kinds)
        while cut and kinds[cut - 1] not in _STAGED:
            cut -= 1
        self._by_group[id(conv.group)] = (conv, conv.nodes[:cut], front)
        return front


def _same_front(staged: tuple[Node, ...], nodes: tuple[Node, ...], kinds: list[NodeKind]
                ) -> bool:
    """Whether ``nodes`` begin with the ``staged`` nodes and hold no stage node after."""
    cut = len(staged)
    return len(nodes) >= cut and all(map(is_, staged, nodes)) and \
        _STAGED.isdisjoint(kinds[cut:])


def _front(conv: Conversion, kinds: list[NodeKind]) -> Front:
    """The stages, and the specs of each stage an op reads (all but the last: none when
    there is no op)."""
    values = stages(conv, kinds)
    return values, tuple(map(stage_specs, values[:-1]))


def plan_step(conv: Conversion, piece_bytes: int = PIECE_BYTES, fronts: Fronts | None = None
              ) -> Step:
    """Destinations from the sinks, then fragments pushed back through the ops as far as
    they go; reads land where the fragments say. ``fronts``: the stages of conversions
    lowered before, reused where this one's are the same nodes. A plain key's conversion
    (one read, a cast at most, one sink: :data:`_LONE`, the one test) is lowered by
    :func:`lone_step` to the step this gives it, without its stages."""
    nodes = conv.nodes
    kinds = list(map(_KIND, nodes))
    if kinds in _LONE:
        lone = lone_step(conv, piece_bytes)
        if lone is not None:
            return lone
    return staged_step(conv, kinds, piece_bytes, fronts)


_LONE = ([NodeKind.READ, NodeKind.SINK], [NodeKind.READ, NodeKind.CAST, NodeKind.SINK])


def lone_step(conv: Conversion, piece_bytes: int = PIECE_BYTES) -> Step | None:
    """A plain key's step: its read lands whole in its sink's destination (through the cast,
    unchanged). ``None`` where the nodes are not one source's read feeding its sink, or
    the sink is discarded: :func:`staged_step` lowers (or refuses) those."""
    nodes, sources = conv.nodes, conv.group.sources
    read, sink = nodes[0], nodes[-1]
    stream = nodes[1].inputs if len(nodes) == 3 else sink.inputs
    dest = sink.attrs.dest  # type: ignore[union-attr]
    if len(sources) != 1 or len(sources[0]) != 1 or len(stream) != 1 or stream[0] is not read \
            or sink.inputs[0] is not nodes[-2] or dest.kind is DestKind.DISCARD \
            or read.attrs.source != _ORIGIN:  # type: ignore[union-attr]
        return None
    dests = (dest,)
    reads = placed_reads((stream,), ((_whole(dest.spec.shape, dest.stride, 0),),), dests,
                         piece_bytes)
    return Step(conv.label, nodes[-1:], _staging(dests, reads, False), reads, (stream,), (), ())


_ORIGIN = (0, 0)


def staged_step(conv: Conversion, kinds: list[NodeKind], piece_bytes: int = PIECE_BYTES,
                fronts: Fronts | None = None) -> Step:
    """:func:`plan_step` through the conversion's stages (any conversion; ``kinds``: its
    nodes' kinds)."""
    nodes = conv.nodes
    values, specs = _front(conv, kinds) if fronts is None else fronts.of(conv, kinds)
    sinks = _sinks(nodes, kinds)
    written, dests = _written(sinks)
    if NodeKind.QUANTIZE in kinds:
        return _quantize_step(conv.label, sinks, values, written, dests, piece_bytes)
    frags = _final_fragments(values[-1], written, dests)
    m = len(values) - 1
    while m > 0:
        placed = stage_op(values[m]).place(frags, specs[m - 1])
        if placed is None:
            break
        frags, m = placed, m - 1
    if m == 0:
        reads = placed_reads(values[0], frags, dests, piece_bytes)
        return Step(conv.label, sinks, _staging(dests, reads, False), reads, values[0], (), ())
    if m == 1 == len(values) - 1:
        kept = stage_op(values[1]).place_kept(frags, specs[0])
        if kept is not None and _updatable(values[1], frags, dests):
            return _update_step(conv.label, sinks, values, kept, frags, dests, piece_bytes)
    reads = tuple(read_task(n, Region.full(n.spec.shape), None, False, piece_bytes)
                  for stream in values[0] for n in stream)
    return Step(conv.label, sinks, _staging(dests, reads, True), reads, values[0],
                values[1:m + 1], frags)


_UPDATABLE = (DestKind.ALLOCATE, DestKind.IN_PLACE, DestKind.MEMORY)


def _updatable(outputs: Streams[Node], frags: Streams[tuple[Fragment, ...]],
               dests: tuple[Destination, ...]) -> bool:
    """Whether the last op's outputs can be updated where they land: each one whole in one
    tensor-backed destination of its own dtype (no cast after it: the op rounds once),
    unsharded."""
    for stream, placed in zip(outputs, frags, strict=True):
        for node, found in zip(stream, placed, strict=True):
            if len(found) != 1:
                return False
            f = found[0]
            d = dests[f.target]
            if (d.kind not in _UPDATABLE or d.shard is not None or d.spec.dtype != node.spec.dtype
                    or f.region != Region.full(node.spec.shape)):
                return False
    return True


def _update_step(label: str, sinks: tuple[Node, ...], values: tuple[Streams[Node], ...],
                 kept: tuple[tuple[tuple[Fragment, ...], ...] | None, ...],
                 outputs: Streams[tuple[Fragment, ...]], dests: tuple[Destination, ...],
                 piece_bytes: int) -> Step:
    """The kept inputs read into their place in the destinations, the others held; the op
    then updates ``outputs`` in place (``Step.in_place``)."""
    sources = values[0]
    placed = [(s, k) for s, k in zip(sources, kept, strict=True) if k is not None]
    reads = placed_reads(tuple(s for s, _ in placed), tuple(k for _, k in placed), dests,
                         piece_bytes)
    reads += tuple(read_task(n, Region.full(n.spec.shape), None, False, piece_bytes)
                   for stream, k in zip(sources, kept, strict=True) if k is None
                   for n in stream)
    return Step(label, sinks, dests, reads, sources, values[1:], outputs, in_place=True)


def _sinks(nodes: tuple[Node, ...], kinds: list[NodeKind]) -> tuple[Node, ...]:
    """The sink nodes, looked for from the first one on when the last node is one (as a
    built conversion's is: its sinks follow its stages; then, when nothing else lies
    among them, they are the nodes' tail as it is)."""
    if NodeKind.SINK not in kinds[-1:]:
        return tuple(compress(nodes, map(is_, kinds, repeat(NodeKind.SINK))))
    first = kinds.index(NodeKind.SINK)
    tail = kinds[first:]
    if tail.count(NodeKind.SINK) == len(tail):
        return nodes[first:]
    return tuple(compress(nodes[first:], map(is_, tail, repeat(NodeKind.SINK))))


def _written(sinks: tuple[Node, ...]) -> tuple[list[Node], tuple[Destination, ...]]:
    """The sinks whose destination is written (not discarded), and those destinations."""
    every = tuple(map(_DEST, sinks))
    if DestKind.DISCARD not in map(_DEST_KIND, every):
        return list(sinks), every
    kept = [d.kind is not DestKind.DISCARD for d in every]
    return list(compress(sinks, kept)), tuple(compress(every, kept))


def _quantize_step(label: str, sinks: tuple[Node, ...], values: tuple[Streams[Node], ...],
                   written: list[Node], dests: tuple[Destination, ...], piece_bytes: int) -> Step:
    """Reads held, every op stage run on tensors, then quantized (see quant_steps)."""
    outputs, tasks = _quant_steps().quantize_plan(values[-1], written, dests)
    reads = tuple(read_task(n, Region.full(n.spec.shape), None, False, piece_bytes)
                  for stream in values[0] for n in stream)
    return Step(label, sinks, _staging(dests, reads, True), reads, values[0], values[1:],
                outputs, tasks)


@cache
def _quant_steps() -> ModuleType:
    """``quant_steps``, imported by the first step that quantizes (once)."""
    from weightplan.planner.tensors.lower import quant_steps

    return quant_steps


@cache
def _shard_nodes() -> ModuleType:
    """``shard_nodes``, imported by the first step under tensor parallelism (once)."""
    from weightplan.planner.tensors.ir import shard_nodes

    return shard_nodes


def _final_fragments(outputs: Streams[Node], written: list[Node],
                     dests: tuple[Destination, ...]) -> Streams[tuple[Fragment, ...]]:
    """Each destination as fragments of the last stage's value it comes from: through a
    cast unchanged, through a shard as the shard's pieces of its input (one per piece,
    each landing in its slice of the local destination)."""
    counts = tuple(map(len, outputs))
    position = dict(zip(chain.from_iterable(outputs), dense_sources(counts), strict=True))
    final: list[list[tuple[Fragment, ...]]] = [[()] * n for n in counts]
    for target, (sink, d) in enumerate(zip(written, dests, strict=True)):
        value = sink.inputs[0]
        placed = _whole(d.spec.shape, d.stride, target)
        at = position.get(value)
        while at is None:
            if value.kind is NodeKind.SHARD:  # this rank's pieces of its input
                placed = _shard_nodes().shard_fragments(value, target, placed[0].view)
            elif value.kind is not NodeKind.CAST:
                raise PlanError(f"{value!r} between the ops and {sink!r} can't be placed; only "
                                "casts and shards may sit there")
            value = value.inputs[0]
            at = position.get(value)
        final[at[0]][at[1]] += placed
    return tuple(map(tuple, final))


@lru_cache(maxsize=1 << 14)
def _whole(shape: tuple[int, ...], stride: tuple[int, ...], target: int
           ) -> tuple[Fragment, ...]:
    """A destination's whole fragment (its full region into its whole view), one object
    for the destinations of one shape and stride landing at one place of their steps."""
    return (Fragment(Region.full(shape), target, View(shape, stride)),)


def _staging(dests: tuple[Destination, ...], reads: tuple[ReadTask, ...], materialized: bool
             ) -> tuple[Destination, ...]:
    """File destinations written by anything but direct byte copies are staged in memory."""
    if DestKind.FILE not in map(_DEST_KIND, dests):
        return dests
    indirect = {r.fragment.target for r in reads if r.fragment is not None and not r.direct}
    return tuple(replace(d, staged=True)
                 if d.kind is DestKind.FILE and (materialized or i in indirect) else d
                 for i, d in enumerate(dests))
