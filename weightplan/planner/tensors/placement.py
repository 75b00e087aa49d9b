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
the nodes it runs, and :mod:`~weightplan.planner.tensors.verify` checks it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from itertools import compress, filterfalse, repeat
from operator import attrgetter, is_, itemgetter

import torch

from weightplan.errors import PlanError
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.build import Conversion, stage_op, stage_specs, stages
from weightplan.planner.tensors.destination import Destination, DestKind
from weightplan.planner.tensors.geometry import CACHE_SIZE, Fragment, Region, View, _is_contiguous
from weightplan.planner.quant.blocks import DEQUANTIZE_BYTES, workspace_bytes
from weightplan.planner.tensors.nodes import (
    DequantizeAttrs, Node, NodeKind, op_attrs, read_attrs, sink_attrs,
)
from weightplan.planner.tensors.quant_steps import QuantizeTask, quantize_plan
from weightplan.planner.tensors.ops.base import ConversionOp, Streams
from weightplan.planner.tensors.sharding.fp8_slices import scale_region
from weightplan.planner.tensors.sharding.shard_nodes import shard_fragments
from weightplan.planner.tensors.spec import TensorSpec

PIECE_BYTES = 32 * 1024 * 1024  # direct reads larger than this are split into pieces
_LENGTH, _SCALE_BYTES, _WINDOW_BYTES = (attrgetter("layout.length"), attrgetter("layout.scale_bytes"),
                                       attrgetter("layout.window_bytes"))
_TMP_BYTES, _FRAGMENT = attrgetter("tmp_bytes"), attrgetter("fragment")
_KIND, _INPUTS, _SOURCE = attrgetter("kind"), attrgetter("inputs"), attrgetter("attrs.source")


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
        return read_attrs(self.read).entry

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
        if self.dequantize is None or self.scale is None:
            return None
        return scale_region(self.entry.spec.shape, self.scale.spec.shape, self.region,
                            self.dequantize.block)

    @property
    def work_bytes(self) -> int:
        """Besides the window: a dequantize's scales and its fp32 chunk workspace."""
        if self.dequantize is None or self.scale is None:
            return 0
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


def read_task(node: Node, region: Region, fragment: Fragment | None, direct: bool,
              piece_bytes: int = PIECE_BYTES) -> ReadTask:
    """The byte range of ``region`` of ``node``'s entry; direct reads over ``piece_bytes``
    are split into pieces so that they run in parallel (each piece is one mapped window)."""
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

    @property
    def ops(self) -> tuple[ConversionOp, ...]:
        """The materialized ops, in order."""
        return tuple(stage_op(stage) for stage in self.materialize)

    @cached_property
    def read_bytes(self) -> int:
        return sum(map(_LENGTH, self.reads)) + sum(map(_SCALE_BYTES, self.reads))

    @cached_property
    def needed_bytes(self) -> int:
        """The bytes of the regions read (a dequantize's scale tiles included)."""
        return sum(r.region.numel * r.entry.spec.dtype.itemsize + r.scale_bytes
                   for r in self.reads)

    @cached_property
    def dest_bytes(self) -> int:
        """Bytes this step allocates that stay resident (0 when writing in place)."""
        return sum(d.spec.nbytes for d in self.destinations if d.allocates)

    @cached_property
    def staged_bytes(self) -> int:
        """Output tensors assembled in memory until the step is finalized."""
        return sum(d.spec.nbytes for d in self.destinations if d.staged)

    @cached_property
    def held_bytes(self) -> int:
        """Temporaries kept until the materialized ops run."""
        return sum(map(_TMP_BYTES, filterfalse(_FRAGMENT, self.reads)))  # (placed ones: 0)

    @cached_property
    def window_sizes(self) -> tuple[int, ...]:
        """Mapped file windows of the reads, each live only while its read runs."""
        return tuple(filter(None, map(_WINDOW_BYTES, self.reads)))

    @cached_property
    def convert_bytes(self) -> int:
        """Upper bound of the tensors the materialized ops allocate."""
        ops = sum(sum(n.spec.nbytes for stream in stage for n in stream)
                  for stage in self.materialize if stage_op(stage).allocates)
        return ops + sum(t.work_bytes for t in self.quantized)

    @cached_property
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
        reads = _placed_reads(values[0], frags, dests, piece_bytes)
        return Step(conv.label, sinks, _staging(dests, reads, False), reads, values[0], (), ())
    reads = tuple(read_task(n, Region.full(n.spec.shape), None, False, piece_bytes)
                  for stream in values[0] for n in stream)
    return Step(conv.label, sinks, _staging(dests, reads, True), reads, values[0],
                values[1:m + 1], frags)


def _scan(conv: Conversion) -> tuple[tuple[Streams[Node], ...], tuple[Node, ...], bool]:
    """:func:`~weightplan.planner.tensors.build.stages`, the sinks and whether anything
    is quantized, in C-level passes over the conversion's nodes (a stack of 256 FP8
    experts has ~800 of them)."""
    nodes = conv.nodes
    kinds = list(map(_KIND, nodes))
    present = set(kinds)
    reads = list(compress(nodes, map(is_, kinds, repeat(NodeKind.READ))))
    reads.reverse()  # the first read of a source wins (a scale's read sits behind its weight)
    first: dict[tuple[int, int], Node] = dict(zip(map(_SOURCE, reads), reads, strict=True))
    if NodeKind.DEQUANTIZE in present:  # the op chain's input in place of the read
        dequantized = list(compress(nodes, map(is_, kinds, repeat(NodeKind.DEQUANTIZE))))
        first.update(zip(map(_SOURCE, map(itemgetter(0), map(_INPUTS, dequantized))),
                         dequantized, strict=True))
    rows = [first]
    for n in compress(nodes, map(is_, kinds, repeat(NodeKind.OP))):
        a = op_attrs(n)
        while len(rows) <= a.stage + 1:
            rows.append({})
        rows[a.stage + 1][a.position] = n
    sinks = tuple(compress(nodes, map(is_, kinds, repeat(NodeKind.SINK))))
    quantizes = NodeKind.QUANTIZE in present
    values = tuple(map(_dense_streams, rows))
    if (len(rows) > 1 and any(not row for row in rows)) or None in values:
        return stages(conv), sinks, quantizes  # gaps: as stages() says (it raises)
    return values, sinks, quantizes  # type: ignore[return-value]


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


def _placed_reads(sources: Streams[Node], frags: Streams[tuple[Fragment, ...]],
                  dests: tuple[Destination, ...], piece_bytes: int) -> tuple[ReadTask, ...]:
    tasks: list[ReadTask] = []
    dtypes = [d.spec.dtype for d in dests]
    last: tuple = ()
    layout: ReadLayout | None = None
    for i, stream in enumerate(sources):
        for j, node in enumerate(stream):
            entry, scale, block = _read_parts(node)
            spec = entry.spec
            scale_shape, scale_dtype = (None, None) if scale is None else (scale.shape,
                                                                          scale.dtype)
            for f in frags[i][j]:
                v = f.view
                # the experts of a stack share every part of this key (equal tuples and
                # dtypes, the same region object): one layout for all of them
                key = (spec.shape, spec.dtype, entry.file is None, entry.contiguous,
                       scale_shape, scale_dtype, block, f.region, v.shape, v.stride,
                       dtypes[f.target], piece_bytes)
                if key != last:
                    last, layout = key, _geometry(*key)
                if layout is not None:
                    tasks.append(ReadTask(node, f.region, f, layout))
    return tuple(tasks)


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
