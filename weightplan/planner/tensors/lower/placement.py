"""Where every byte lands: lower one conversion of the graph into a :class:`Step`.

Starting from the sink nodes (each a full view of a model tensor, an output-file tensor
or a returned tensor), fragments are pushed backwards through the op nodes, stage by
stage, with ``ConversionOp.place``. When every op places, each read node's bytes go
straight into the slice of the destination a merge/concat/chunk would put them in: no
intermediate at all. A read is *direct* (a plain byte copy) when its destination view is
contiguous, the dtype needs no cast and the source region is one contiguous byte range;
otherwise it is a strided (and casting) copy. When an op can't place, the op nodes up to
it run on materialized tensors and their outputs are copied into the placed views. An
output-file destination written by anything but direct copies is *staged*: assembled in
memory, written once. Everything here is derived from the graph's nodes; the step keeps
the nodes it runs, and :mod:`~weightplan.planner.tensors.verify.verify` checks it. The reads
themselves (byte ranges, pieces, windows) are :mod:`~weightplan.planner.tensors.lower.read_tasks`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import accumulate, chain, compress, filterfalse, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any, Generic, TypeVar, overload

from weightplan.errors import PlanError
from weightplan.planner.tensors.ir.build import Conversion, stage_op, stage_specs, stages
from weightplan.planner.tensors.ir.destination import Destination, DestKind
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, op_attrs, sink_attrs
from weightplan.planner.tensors.lower.quant_steps import QuantizeTask, quantize_plan
from weightplan.planner.core.ops.base import ConversionOp, Streams, stream_positions
from weightplan.planner.tensors.lower.read_tasks import (
    PIECE_BYTES, ReadRun, ReadTask, placed_reads, read_task,
)
from weightplan.planner.tensors.ir.shard_nodes import shard_fragments

_LENGTH, _SCALE_BYTES, _WINDOW_BYTES = (attrgetter("layout.length"), attrgetter("layout.scale_bytes"),
                                       attrgetter("layout.window_bytes"))
_TMP_BYTES, _FRAGMENT = attrgetter("tmp_bytes"), attrgetter("fragment")
_KIND, _INPUTS, _SOURCE = attrgetter("kind"), attrgetter("inputs"), attrgetter("attrs.source")


T = TypeVar("T")


class _once(Generic[T]):  # (a decorator: named as functools.cached_property)
    """``functools.cached_property`` without its lock (Python 3.11 takes one on each first
    read: a third of the cost of the schedule's first pass over a plan's steps)."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _once[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object, owner: type | None = None) -> T | _once[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.compute(obj)  # (read from there from now on)
        return value


@dataclass(frozen=True)
class Step:
    """One conversion of the graph, lowered: what the executor does for it."""

    label: str
    sinks: tuple[Node, ...]  # every sink of the conversion (DISCARD ones included)
    destinations: tuple[Destination, ...]  # the written sinks' destinations, by fragment target
    reads: tuple[ReadTask, ...]
    sources: Streams[Node]  # the READ nodes by source position (inputs of materialized ops)
    materialize: tuple[Streams[Node], ...]  # op-node stages run on tensors (empty: all placed)
    outputs: Streams[tuple[Fragment, ...]]  # where the last materialized stage's outputs land
    quantized: tuple[QuantizeTask, ...] = ()  # values quantized into FP8 weight + scale
    # reads made in columns, each run of one layout (the byte counts below take each whole)
    runs: tuple[ReadRun, ...] = field(default=(), compare=False, repr=False)

    @property
    def ops(self) -> tuple[ConversionOp, ...]:
        """The materialized ops, in order."""
        return tuple(stage_op(stage) for stage in self.materialize)

    @_once
    def read_bytes(self) -> int:
        loose = self.loose_reads
        return (sum(map(_LENGTH, loose)) + sum(map(_SCALE_BYTES, loose))
                + sum(r.count * (r.layout.length + r.layout.scale_bytes) for r in self.runs))

    @property
    def loose_reads(self) -> Sequence[ReadTask]:
        """The reads outside :attr:`runs`, in order (all of them when there are none)."""
        if not self.runs:
            return self.reads
        loose: list[ReadTask] = []
        at = 0
        for run in self.runs:
            loose += self.reads[at:run.start]
            at = run.start + run.count
        return loose + list(self.reads[at:])

    @_once
    def needed_bytes(self) -> int:
        """The bytes of the regions read (a dequantize's scale tiles included)."""
        return sum(r.region.numel * r.entry.spec.dtype.itemsize + r.scale_bytes
                   for r in self.reads)

    @_once
    def dest_bytes(self) -> int:
        """Bytes this step allocates that stay resident (0 when writing in place)."""
        return sum(d.spec.nbytes for d in self.destinations if d.allocates)

    @_once
    def staged_bytes(self) -> int:
        """Output tensors assembled in memory until the step is finalized."""
        return sum(d.spec.nbytes for d in self.destinations if d.staged)

    @_once
    def held_bytes(self) -> int:
        """Temporaries kept until the materialized ops run."""
        return sum(map(_TMP_BYTES, filterfalse(_FRAGMENT, self.loose_reads)))  # (placed: 0)

    def window_counts(self) -> Counter[int]:
        """Mapped file windows of the reads, by size, each live only while its read runs
        (a run's reads, of one size, counted at once)."""
        counts = Counter(filter(None, map(_WINDOW_BYTES, self.loose_reads)))
        for run in self.runs:
            if run.layout.window_bytes:
                counts[run.layout.window_bytes] += run.count
        return counts

    @_once
    def convert_bytes(self) -> int:
        """Upper bound of the tensors the materialized ops allocate."""
        ops = sum(sum(n.spec.nbytes for stream in stage for n in stream)
                  for stage in self.materialize if stage_op(stage).allocates)
        return ops + sum(t.work_bytes for t in self.quantized)

    @_once
    def direct_fraction(self) -> float:
        total = self.read_bytes
        return sum(r.nbytes for r in self.reads if r.direct) / total if total else 1.0


def plan_step(conv: Conversion, piece_bytes: int = PIECE_BYTES) -> Step:
    """Destinations from the sinks, then fragments pushed back through the ops as far as
    they go; reads land where the fragments say."""
    values, sinks, quantizes = _scan(conv)
    written = [s for s in sinks if sink_attrs(s).dest.written]
    dests = tuple(sink_attrs(s).dest for s in written)
    if quantizes:
        return _quantize_step(conv, values, written, dests, piece_bytes)
    frags = _final_fragments(values[-1], written, dests)
    m = len(values) - 1
    while m > 0:
        placed = stage_op(values[m]).place(frags, stage_specs(values[m - 1]))
        if placed is None:
            break
        frags, m = placed, m - 1
    if m == 0:
        built = conv.built  # (its streams' parts, when stage 0 is the one it made)
        alike = built.alike if built is not None and values is built.stages else ()
        reads, runs = placed_reads(values[0], frags, dests, piece_bytes, alike)
        return Step(conv.label, sinks, _staging(dests, reads, False), reads, values[0], (), (),
                    runs=runs)
    reads = tuple(read_task(n, Region.full(n.spec.shape), None, False, piece_bytes)
                  for stream in values[0] for n in stream)
    return Step(conv.label, sinks, _staging(dests, reads, True), reads, values[0],
                values[1:m + 1], frags)


def _scan(conv: Conversion) -> tuple[tuple[Streams[Node], ...], tuple[Node, ...], bool]:
    """:func:`~weightplan.planner.tensors.ir.build.stages`, the sinks and whether anything
    is quantized. The stages are those the conversion was built from when it carries them
    (every stream of them non-empty); else they are read back from the nodes in C-level
    passes (a stack of 256 FP8 experts has ~800 of them)."""
    built = conv.built
    if built is not None and built.nodes is conv.nodes and all(map(all, built.stages)) \
            and all(built.stages):
        tail = conv.nodes[built.tail:]
        kinds = list(map(_KIND, tail))
        sinks = tuple(compress(tail, map(is_, kinds, repeat(NodeKind.SINK))))
        return built.stages, sinks, NodeKind.QUANTIZE in kinds
    return _scan_nodes(conv)


def _scan_nodes(conv: Conversion) -> tuple[tuple[Streams[Node], ...], tuple[Node, ...], bool]:
    """:func:`_scan` from the nodes alone."""
    nodes = conv.nodes
    kinds = list(map(_KIND, nodes))
    present = set(kinds)
    reads = list(compress(nodes, map(is_, kinds, repeat(NodeKind.READ))))
    stack = None
    if NodeKind.DEQUANTIZE in present:  # the op chain's input in place of the read
        dequantized = list(compress(nodes, map(is_, kinds, repeat(NodeKind.DEQUANTIZE))))
        stack = _stack_inputs(reads, dequantized)
    if stack is None:
        reads.reverse()  # the first read of a source wins (a scale's read sits behind its weight)
        first: dict[tuple[int, int], Node] = dict(zip(map(_SOURCE, reads), reads, strict=True))
        if NodeKind.DEQUANTIZE in present:
            first.update(zip(map(_SOURCE, map(itemgetter(0), map(_INPUTS, dequantized))),
                             dequantized, strict=True))
    rows = [first if stack is None else {}]
    for n in compress(nodes, map(is_, kinds, repeat(NodeKind.OP))):
        a = op_attrs(n)
        while len(rows) <= a.stage + 1:
            rows.append({})
        rows[a.stage + 1][a.position] = n
    sinks = tuple(compress(nodes, map(is_, kinds, repeat(NodeKind.SINK))))
    quantizes = NodeKind.QUANTIZE in present
    values = tuple(map(_dense_streams, rows))
    if stack is not None:
        values = (stack, *values[1:])
    gaps = any(not row for row in rows[1:]) or (stack is None and not rows[0])
    if (len(rows) > 1 and gaps) or None in values:
        return stages(conv), sinks, quantizes  # gaps: as stages() says (it raises)
    return values, sinks, quantizes  # type: ignore[return-value]


def _stack_inputs(reads: list[Node], dequantized: list[Node]) -> Streams[Node] | None:
    """Stage 0 when the dequantize nodes run densely by source, in order, and the reads are
    their weights then their scales, in the same order (an FP8 stack): the dequantize nodes,
    cut into streams. ``None``: any other layout (the general scan finds stage 0)."""
    sources = list(map(_SOURCE, map(itemgetter(0), map(_INPUTS, dequantized))))
    counts = tuple(Counter(map(itemgetter(0), sources)).values())
    dense = _dense_sources(counts)
    if sources != dense or len(reads) != 2 * len(dense) or list(map(_SOURCE, reads)) != dense * 2:
        return None
    ends = list(accumulate(counts))
    return tuple(tuple(dequantized[end - n:end]) for n, end in zip(counts, ends, strict=True))


@lru_cache(maxsize=256)
def _dense_sources(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    """(stream, index) of ``counts[i]`` sources in each stream ``i``, in order (not to be
    changed: shared between calls)."""
    return list(chain.from_iterable(map(stream_positions, range(len(counts)), counts)))


def _dense_streams(row: dict[tuple[int, int], Node]) -> Streams[Node] | None:
    """``row`` by (stream, index), when both run densely from 0 (else ``None``)."""
    counts = Counter(map(itemgetter(0), row))
    if sorted(counts) != list(range(len(counts))):
        return None
    try:
        return tuple(tuple(map(row.__getitem__, zip(repeat(i, n), range(n), strict=True)))
                     for i, n in sorted(counts.items()))
    except KeyError:
        return None


def _quantize_step(conv: Conversion, values: tuple[Streams[Node], ...], written: list[Node],
                   dests: tuple[Destination, ...], piece_bytes: int) -> Step:
    """Reads held, every op stage run on tensors, then quantized (see quant_steps)."""
    outputs, tasks = quantize_plan(values[-1], written, dests)
    reads = tuple(read_task(n, Region.full(n.spec.shape), None, False, piece_bytes)
                  for stream in values[0] for n in stream)
    return Step(conv.label, conv.sinks, _staging(dests, reads, True), reads, values[0],
                values[1:], outputs, tasks)


def _final_fragments(outputs: Streams[Node], written: list[Node],
                     dests: tuple[Destination, ...]) -> Streams[tuple[Fragment, ...]]:
    """Each destination as fragments of the last stage's value it comes from: through a
    cast unchanged, through a shard as the shard's pieces of its input (one per piece,
    each landing in its slice of the local destination)."""
    position = {n: (i, j) for i, stream in enumerate(outputs) for j, n in enumerate(stream)}
    final: list[list[tuple[Fragment, ...]]] = [[() for _ in s] for s in outputs]
    for target, (sink, d) in enumerate(zip(written, dests, strict=True)):
        value, view = sink.inputs[0], View(d.spec.shape, d.stride)
        placed: tuple[Fragment, ...] = (Fragment(Region.full(d.spec.shape), target, view),)
        while value not in position:
            if value.kind is NodeKind.SHARD:  # this rank's pieces of its input
                placed = shard_fragments(value, target, view)
            elif value.kind is not NodeKind.CAST:
                raise PlanError(f"{value!r} between the ops and {sink!r} can't be placed; only "
                                "casts and shards may sit there")
            value = value.inputs[0]
        i, j = position[value]
        final[i][j] += placed
    return tuple(tuple(row) for row in final)


def _staging(dests: tuple[Destination, ...], reads: tuple[ReadTask, ...], materialized: bool
             ) -> tuple[Destination, ...]:
    """File destinations written by anything but direct byte copies are staged in memory."""
    if all(d.kind is not DestKind.FILE for d in dests):
        return dests
    indirect = {r.fragment.target for r in reads if r.fragment is not None and not r.direct}
    return tuple(replace(d, staged=True)
                 if d.kind is DestKind.FILE and (materialized or i in indirect) else d
                 for i, d in enumerate(dests))
