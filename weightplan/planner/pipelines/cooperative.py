"""Cooperative reads: each tensor every rank holds whole is read by one rank and broadcast.

Under ``TensorParallel(cooperative=True)`` every rank plans the same whole (replicated)
steps, so every rank can tell, without talking, who reads which: the steps whose written
destinations are all whole are dealt to the ranks by bytes, largest first (deterministic:
ties go to the lower rank, steps in label order), each to the rank with the fewest bytes
so far while it fits under the fair share (⌈total / ranks⌉). A step that doesn't fit is
cut, when it can be, in destination order: that rank reads the leading reads that fill
its share (at least one), the next least-loaded rank goes on from there. A step can be cut
when its reads land straight in one destination (no op run on tensors), in back-to-back
contiguous views covering it: each read whole (a fused expert stack's experts, each with
its own FP8 scale tiles), so a part is a byte range of the destination, and storage bytes
stay ≤ the share plus one read per rank. A rank keeps its own reads; a step with none
becomes a *receive* step: its destinations opened (allocated) and closed unwritten,
nothing read, no op run. The :class:`Exchange` lists, in one order for every rank, each
destination (or byte range of one) with the rank that reads it; the executor broadcasts
each from its reader into the others' destinations before the sink commits
(:mod:`weightplan.executor.exchange`). Receive buffers are the destinations themselves: a
replicated tensor is allocated whole on every rank anyway.

Each rank's plan is verified whole before its steps are dealt (the steps a rank gives
away are the verified ones, read by their owner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from weightplan.planner.core.geometry import View
from weightplan.planner.tensors.ir.shard_nodes import Sharding
from weightplan.planner.tensors.lower.placement import Step


@dataclass(frozen=True, slots=True)
class Shared:
    """A destination's bytes ``[start, start + nbytes)`` (all of them, unless the step was
    cut) read by the ``slot``-th rank of each broadcast group and broadcast to the group's
    other ranks."""

    key: str
    slot: int
    nbytes: int
    start: int = 0


@dataclass(frozen=True)
class Exchange:
    """What this rank reads for the others and receives from them (same order everywhere).

    ``groups`` partition the ranks: one group of all of them when the checkpoint is on a
    file system every node shares, one per node when each node has its own copy.
    """

    rank: int
    world_size: int
    items: tuple[Shared, ...]
    groups: tuple[tuple[int, ...], ...]

    @property
    def group(self) -> tuple[int, ...]:
        """This rank's broadcast group."""
        return next(g for g in self.groups if self.rank in g)

    @property
    def slot(self) -> int:
        return self.group.index(self.rank)

    def owner(self, item: Shared) -> int:
        """The rank of this rank's group that reads ``item``."""
        return self.group[item.slot]

    @property
    def received_bytes(self) -> int:
        return sum(i.nbytes for i in self.items if i.slot != self.slot)

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank broadcasts, counted once per receiving rank."""
        return (len(self.group) - 1) * sum(i.nbytes for i in self.items if i.slot == self.slot)

    @property
    def network_bytes(self) -> int:
        return self.received_bytes + self.sent_bytes


def is_whole(step: Step) -> bool:
    """Every destination ``step`` writes is held whole by every rank (none is sharded)."""
    written = [d for d in step.destinations if d.written]
    return bool(written) and all(d.shard is None or not d.shard.placement.is_sharded
                                 for d in written)


@dataclass(frozen=True, slots=True)
class Part:
    """The reads ``reads`` (indices into a step's reads) of a step, read by ``slot``;
    ``span``: the destination bytes they fill when the step was cut, else ``None``."""

    slot: int
    reads: tuple[int, ...]
    span: tuple[int, int] | None = None  # (start, nbytes)


def row_order(step: Step) -> list[tuple[int, View]] | None:
    """The step's reads (index, destination view) in destination order when the step can
    be cut (see the module docstring), else ``None``."""
    dests, reads = step.destinations, step.reads
    if (len(dests) != 1 or len(reads) < 2 or step.materialize or step.quantized
            or step.in_place or step.offloaded):
        return None
    spec = dests[0].spec
    if not spec.numel or spec.nbytes % spec.numel:
        return None
    views: list[View] = []
    for r in reads:
        f = r.fragment
        if f is None or f.target != 0 or not f.view.is_contiguous():
            return None
        views.append(f.view)
    order = sorted(enumerate(views), key=lambda iv: iv[1].offset)
    at = 0
    for _, view in order:
        if view.offset != at:
            return None
        at += view.numel
    return order if at == spec.numel else None


def owners(steps: Sequence[Step], size: int) -> dict[str, tuple[Part, ...]]:
    """Step label → who reads which of its reads (see the module docstring)."""
    load = [0] * size
    share = -(-sum(s.read_bytes for s in steps) // size)
    out: dict[str, tuple[Part, ...]] = {}
    for step in sorted(steps, key=lambda s: (-s.read_bytes, s.label)):
        order = row_order(step)
        if order is None:  # (dealt whole)
            rank = min(range(size), key=lambda r: (load[r], r))
            load[rank] += step.read_bytes
            out[step.label] = (Part(rank, tuple(range(len(step.reads)))),)
            continue
        sizes = [step.reads[i].layout.requested for i, _ in order]
        itemsize = step.destinations[0].spec.nbytes // step.destinations[0].spec.numel
        parts, first, rest = [], 0, step.read_bytes
        while first < len(order):
            rank = min(range(size), key=lambda r: (load[r], r))
            stop, taken = first + 1, sizes[first]
            if rest > share - load[rank]:  # (cut: the reads that fill its share)
                while stop < len(order) and load[rank] + taken + sizes[stop] <= share:
                    taken += sizes[stop]
                    stop += 1
            else:
                stop, taken = len(order), rest
            load[rank] += taken
            rest -= taken
            cut = order[first:stop]
            parts.append(Part(rank, tuple(i for i, _ in cut), (
                cut[0][1].offset * itemsize, sum(v.numel for _, v in cut) * itemsize)))
            first = stop
        out[step.label] = tuple(parts)
    return out


def receive_step(step: Step) -> Step:
    """``step`` with nothing to read or run: its destinations arrive by broadcast."""
    empty: dict[str, object] = {f.name: () for f in dataclasses.fields(step)
             if f.name in ("reads", "sources", "materialize", "outputs", "quantized", "runs")}
    return dataclasses.replace(step, **empty)  # type: ignore[arg-type]


class Sharer:
    """The step hook of :func:`~weightplan.planner.pipelines.lower.lower`: deals the whole
    steps of a cooperative load and keeps the :class:`Exchange`."""

    def __init__(self, sharding: Sharding):
        self.sharding = sharding
        self.exchange: Exchange | None = None

    def __call__(self, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        sharding = self.sharding
        world, local = sharding.world_size, sharding.local_world_size
        size = local if sharding.storage == "node" else world
        groups = tuple(tuple(range(b, b + size)) for b in range(0, world, size))
        whole = [s for s in steps if is_whole(s) and s.read_bytes]
        dealt = owners(whole, size)
        items = sorted(_items(whole, dealt), key=lambda i: (i.key, i.start))
        self.exchange = Exchange(sharding.rank, world, tuple(items), groups)
        mine = self.exchange.slot
        return tuple(_kept(s, dealt.get(s.label), mine) for s in steps)


def _items(whole: Sequence[Step], dealt: dict[str, tuple[Part, ...]]) -> list[Shared]:
    items = []
    for step in whole:
        for part in dealt[step.label]:
            if part.span is None:
                items += [Shared(d.key, part.slot, d.spec.nbytes) for d in step.destinations
                          if d.written]
            else:
                start, nbytes = part.span
                items.append(Shared(step.destinations[0].key, part.slot, nbytes, start))
    return items


def _kept(step: Step, parts: tuple[Part, ...] | None, mine: int) -> Step:
    """``step`` as rank slot ``mine`` runs it: whole, its own reads only, or received."""
    if parts is None:
        return step
    reads = sorted(i for p in parts if p.slot == mine for i in p.reads)
    if not reads:
        return receive_step(step)
    if len(reads) == len(step.reads):
        return step
    return dataclasses.replace(step, reads=tuple(step.reads[i] for i in reads))


def sharer(sharding: Sharding | None) -> Sharer | None:
    """The hook for a cooperative load, else ``None``."""
    return Sharer(sharding) if sharding is not None and sharding.cooperative \
        and sharding.world_size > 1 else None
