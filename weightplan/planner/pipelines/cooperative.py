"""Cooperative reads: each tensor every rank holds whole is read by one rank and broadcast.

Under ``TensorParallel(cooperative=True)`` every rank plans the same whole (replicated)
steps, so every rank can tell, without talking, who reads which: the steps whose written
destinations are all whole are dealt to the ranks by bytes, largest first, each to the
rank with the fewest bytes so far (deterministic: ties go to the lower rank, steps in
label order). A rank keeps its own steps; each other one becomes a *receive* step: its
destinations opened (allocated) and closed unwritten, nothing read, no op run. The
:class:`Exchange` lists, in one order for every rank, each destination with the rank that
reads it; the executor broadcasts each from its reader into the others' destinations
before the sink commits (:mod:`weightplan.executor.exchange`). Receive buffers are the
destinations themselves: a replicated tensor is allocated whole on every rank anyway.

Each rank's plan is verified whole before its steps are dealt (the steps a rank gives
away are the verified ones, read by their owner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from weightplan.planner.tensors.ir.shard_nodes import Sharding
from weightplan.planner.tensors.lower.placement import Step


@dataclass(frozen=True, slots=True)
class Shared:
    """A whole destination read by the ``slot``-th rank of each broadcast group and
    broadcast to the group's other ranks."""

    key: str
    slot: int
    nbytes: int


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


def owners(steps: Sequence[Step], size: int) -> dict[str, int]:
    """Step label → the slot (rank of a broadcast group) that reads it, dealt by bytes
    (see the module docstring)."""
    load = [0] * size
    out: dict[str, int] = {}
    for step in sorted(steps, key=lambda s: (-s.read_bytes, s.label)):
        rank = min(range(size), key=lambda r: (load[r], r))
        load[rank] += step.read_bytes
        out[step.label] = rank
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
        slot = owners(whole, size)
        items = sorted((Shared(d.key, slot[s.label], d.spec.nbytes) for s in whole
                        for d in s.destinations if d.written), key=lambda i: i.key)
        self.exchange = Exchange(sharding.rank, world, tuple(items), groups)
        mine = self.exchange.slot
        return tuple(receive_step(s) if slot.get(s.label, mine) != mine else s for s in steps)


def sharer(sharding: Sharding | None) -> Sharer | None:
    """The hook for a cooperative load, else ``None``."""
    return Sharer(sharding) if sharding is not None and sharding.cooperative \
        and sharding.world_size > 1 else None
