"""Where every byte lands: turn a conversion into read tasks and (rarely) op runs.

Starting from the destinations (each target is a full view of a model tensor, or of a
tensor in an output file), fragments are pushed backwards through the op chain with
``ConversionOp.place``. When every op places, each source tensor's bytes go straight into
the slice of the destination a merge/concat/chunk would put them in: no intermediate at
all. A read is *direct* (a plain byte copy) when its destination view is contiguous, the
dtype needs no cast and the source region is one contiguous byte range; otherwise it is a
strided (and casting) copy. When an op can't place, the ops up to it run on materialized
tensors and their outputs are copied into the placed views. An output-file destination
written by anything but direct copies is *staged*: assembled in memory, written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property

from weightplan.planner.tensors.build import Conversion, Target, TargetStatus
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.geometry import Fragment, Region, View
from weightplan.planner.tensors.ops.base import ConversionOp, Streams
from weightplan.planner.tensors.spec import TensorSpec

WINDOW_BYTES = 32 * 1024 * 1024  # direct reads larger than this are split into pieces


class DestKind(Enum):
    ALLOCATE = "allocate"  # a new model tensor, resident after the load
    IN_PLACE = "in place"  # an existing model tensor's storage
    FILE = "file"  # a tensor in an output file: written, then released


@dataclass(frozen=True, slots=True)
class Destination:
    """A tensor a program writes."""

    key: str
    aliases: tuple[str, ...]
    spec: TensorSpec
    kind: DestKind
    stride: tuple[int, ...]
    staged: bool = False  # FILE: assembled in memory, then written in one piece

    @property
    def allocates(self) -> bool:
        return self.kind is DestKind.ALLOCATE


def model_destination(t: Target) -> Destination:
    """Load: a model tensor (allocated when on meta) or a plain output when there's no model."""
    if t.model is None:
        return Destination(t.key, (t.key,), t.dest, DestKind.ALLOCATE,
                           View.contiguous(t.dest.shape).stride)
    kind = DestKind.ALLOCATE if t.model.allocates else DestKind.IN_PLACE
    return Destination(t.key, t.model.aliases, t.dest, kind, t.model.stride)


def file_destination(t: Target) -> Destination:
    """Save / convert: a tensor of an output file."""
    return Destination(t.key, (t.key,), t.dest, DestKind.FILE, View.contiguous(t.dest.shape).stride)


@dataclass(frozen=True, slots=True)
class ReadTask:
    """Read ``region`` of a checkpoint tensor; land it in ``fragment`` (or keep it whole)."""

    entry: TensorEntry
    source: tuple[int, int]  # (stream, index) within the conversion's sources
    region: Region
    fragment: Fragment | None  # None: kept as an input of the materialized ops
    direct: bool  # a plain byte copy: contiguous destination, same dtype, one byte range
    byte_range: tuple[int, int] = field(init=False)  # (absolute file offset, length)
    pieces: tuple[tuple[int, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        first, count = self.region.element_span(self.entry.spec.shape)
        size = self.entry.spec.dtype.itemsize
        total = count * size
        object.__setattr__(self, "byte_range", (self.entry.offset + first * size, total))
        # big direct reads are split so they run in parallel; each piece is one mapped window
        split = self.direct and total > WINDOW_BYTES
        pieces = tuple((s, min(WINDOW_BYTES, total - s)) for s in range(0, total, WINDOW_BYTES))
        object.__setattr__(self, "pieces", pieces if split else ((0, total),))

    @property
    def nbytes(self) -> int:
        return self.byte_range[1]

    @property
    def tmp_bytes(self) -> int:
        """Bytes of a temporary kept after the read (only for materialized-op inputs)."""
        return self.nbytes if self.fragment is None and self.entry.file is not None else 0

    @property
    def window_bytes(self) -> int:
        """The largest file window this task maps at once (0 for in-memory sources)."""
        return 0 if self.entry.file is None else max(length for _, length in self.pieces)


@dataclass(frozen=True)
class Program:
    """What the executor does for one conversion, decided at plan time."""

    conversion: Conversion
    destinations: tuple[Destination, ...]
    reads: tuple[ReadTask, ...]
    materialize: tuple[ConversionOp, ...]  # ops run on tensors (empty: everything placed)
    outputs: Streams[tuple[Fragment, ...]]  # where the materialized ops' outputs land

    @cached_property
    def read_bytes(self) -> int:
        return sum(r.nbytes for r in self.reads)

    @cached_property
    def needed_bytes(self) -> int:
        return sum(r.region.numel * r.entry.spec.dtype.itemsize for r in self.reads)

    @cached_property
    def dest_bytes(self) -> int:
        """Bytes this program allocates for the model (0 when writing in place)."""
        return sum(d.spec.nbytes for d in self.destinations if d.allocates)

    @cached_property
    def staged_bytes(self) -> int:
        """Output tensors assembled in memory until the step is finalized."""
        return sum(d.spec.nbytes for d in self.destinations if d.staged)

    @cached_property
    def held_bytes(self) -> int:
        """Temporaries kept until the materialized ops run."""
        return sum(r.tmp_bytes for r in self.reads)

    @cached_property
    def window_sizes(self) -> tuple[int, ...]:
        """Mapped file windows of the reads, each live only while its read runs."""
        return tuple(r.window_bytes for r in self.reads if r.window_bytes)

    @cached_property
    def convert_bytes(self) -> int:
        """Upper bound of the tensors the materialized ops allocate."""
        stages = self.conversion.stages
        return sum(sum(s.nbytes for stream in stages[k + 1] for s in stream)
                   for k, op in enumerate(self.materialize) if op.allocates)

    @cached_property
    def direct_fraction(self) -> float:
        total = self.read_bytes
        return sum(r.nbytes for r in self.reads if r.direct) / total if total else 1.0


def plan_program(conv: Conversion,
                 destination: Callable[[Target], Destination] = model_destination) -> Program:
    """Destinations, then fragments pushed back through the ops as far as they go."""
    loads = [t for t in conv.targets if t.status is TargetStatus.LOAD]
    dests = tuple(destination(t) for t in loads)
    final: list[list[tuple[Fragment, ...]]] = [[() for _ in s] for s in conv.stages[-1]]
    for index, (t, d) in enumerate(zip(loads, dests)):
        i, j = t.position
        final[i][j] = (Fragment(Region.full(t.dest.shape), index, View(d.spec.shape, d.stride)),)
    frags: Streams[tuple[Fragment, ...]] = tuple(tuple(row) for row in final)
    m = len(conv.ops)
    while m > 0:
        placed = conv.ops[m - 1].place(frags, conv.stages[m - 1])
        if placed is None:
            break
        frags, m = placed, m - 1
    if m == 0:
        reads = _placed_reads(conv, frags, dests)
        return Program(conv, _staging(dests, reads, False), reads, (), ())
    reads = tuple(ReadTask(e, (i, j), Region.full(e.spec.shape), None, False)
                  for i, stream in enumerate(conv.group.sources) for j, e in enumerate(stream))
    return Program(conv, _staging(dests, reads, True), reads, conv.ops[:m], frags)


def _staging(dests: tuple[Destination, ...], reads: tuple[ReadTask, ...], materialized: bool
             ) -> tuple[Destination, ...]:
    """File destinations written by anything but direct byte copies are staged in memory."""
    indirect = {r.fragment.target for r in reads if r.fragment is not None and not r.direct}
    return tuple(replace(d, staged=True)
                 if d.kind is DestKind.FILE and (materialized or i in indirect) else d
                 for i, d in enumerate(dests))


def _placed_reads(conv: Conversion, frags: Streams[tuple[Fragment, ...]],
                  dests: tuple[Destination, ...]) -> tuple[ReadTask, ...]:
    tasks = []
    for i, stream in enumerate(conv.group.sources):
        for j, entry in enumerate(stream):
            for f in frags[i][j]:
                if f.region.numel == 0:
                    continue
                tasks.append(ReadTask(entry, (i, j), f.region, f, _direct(entry, f, dests)))
    return tuple(tasks)


def _direct(entry: TensorEntry, f: Fragment, dests: tuple[Destination, ...]) -> bool:
    _, count = f.region.element_span(entry.spec.shape)
    return (entry.contiguous and f.view.is_contiguous() and count == f.region.numel
            and dests[f.target].spec.dtype == entry.spec.dtype)
