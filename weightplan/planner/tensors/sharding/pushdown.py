"""Push one rank's shard of each conversion output down to the checkpoint reads.

A rank's local tensor is a set of fragments of the global output (``shard_math``). The
op chain's ``place`` maps output fragments back to input fragments, op by op, exactly as
an unsharded load lands reads in their final place; so a row shard of a
``MergeModulelist``/``Concatenate`` result becomes the row shards of its inputs, a
``_StridedShard`` of a packed gate|up takes its half of each of gate and up, and a
``Transpose`` swaps the sharded dim. When an op can't place (``PermuteForRope`` on a
partial region, a user op without ``place``), the rank reads its sources *whole*, runs
the ops, and keeps its fragments: the program says so (``whole``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from weightplan.planner.tensors.build import Conversion, Target, TargetStatus
from weightplan.planner.tensors.geometry import Fragment, Region, View
from weightplan.planner.tensors.ops.base import ConversionOp, Streams
from weightplan.planner.tensors.placement import (
    Destination, Program, ReadTask, model_destination, _direct,
)
from weightplan.planner.tensors.sharding.placements import Placement
from weightplan.planner.tensors.sharding.shard_math import local_fragments, local_shape
from weightplan.planner.tensors.spec import TensorSpec


def push_down(ops: tuple[ConversionOp, ...], stages: tuple[Streams[TensorSpec], ...],
              frags: Streams[tuple[Fragment, ...]]) -> tuple[Streams[tuple[Fragment, ...]], int]:
    """Fragments of the last stage pushed back through ``ops``; returns them and the
    number of ops that could not place (0: the fragments are on the sources)."""
    m = len(ops)
    while m > 0:
        placed = ops[m - 1].place(frags, stages[m - 1])
        if placed is None:
            break
        frags, m = placed, m - 1
    return frags, m


@dataclass(frozen=True, slots=True)
class DestShard:
    """What a destination is in the global picture: the parameter's placement and shape."""

    placement: Placement
    global_spec: TensorSpec


@dataclass(frozen=True)
class ShardedProgram:
    """One rank's :class:`Program` for a conversion: local destinations, pushed-down reads."""

    program: Program
    shards: tuple[DestShard, ...]  # one per destination of the program

    @property
    def whole(self) -> bool:
        """True when an op could not place: the sources are read whole."""
        return bool(self.program.materialize)

    @cached_property
    def read_bytes(self) -> int:
        """Bytes this rank reads: the regions' own bytes (not the spans enclosing them)."""
        return self.program.needed_bytes

    @cached_property
    def held_bytes(self) -> int:
        return sum(d.spec.nbytes for d in self.program.destinations)

    @cached_property
    def replicated_bytes(self) -> int:
        return sum(d.spec.nbytes for d, s in zip(self.program.destinations, self.shards)
                   if not s.placement.is_sharded)


def shard_program(conv: Conversion, placement_of: Callable[[str], Placement], world: int,
                  rank: int, destination: Callable[[Target], Destination] = model_destination
                  ) -> ShardedProgram:
    """``rank``'s program for ``conv``: each target's local part, read as narrowly as the
    ops allow."""
    loads = [t for t in conv.targets if t.status is TargetStatus.LOAD]
    shards, dests = [], []
    for t in loads:
        glob = destination(t)
        p = placement_of(t.key).normalized(len(glob.spec.shape))
        shape = local_shape(p, glob.spec.shape, world, rank)
        spec = TensorSpec(shape, glob.spec.dtype)
        dests.append(replace(glob, spec=spec, stride=View.contiguous(shape).stride))
        shards.append(DestShard(p, glob.spec))
    final: list[list[tuple[Fragment, ...]]] = [[() for _ in s] for s in conv.stages[-1]]
    for index, (t, s) in enumerate(zip(loads, shards)):
        i, j = t.position
        final[i][j] = local_fragments(s.placement, s.global_spec.shape, world, rank, index)
    frags, m = push_down(conv.ops, conv.stages, tuple(tuple(row) for row in final))
    dests_t = tuple(dests)
    if m == 0:
        reads = _reads(conv, frags, dests_t)
        return ShardedProgram(Program(conv, dests_t, reads, (), ()), tuple(shards))
    reads = tuple(ReadTask(e, (i, j), Region.full(e.spec.shape), None, False)
                  for i, stream in enumerate(conv.group.sources) for j, e in enumerate(stream))
    return ShardedProgram(Program(conv, dests_t, reads, conv.ops[:m], frags), tuple(shards))


def _reads(conv: Conversion, frags: Streams[tuple[Fragment, ...]],
           dests: tuple[Destination, ...]) -> tuple[ReadTask, ...]:
    tasks = []
    for i, stream in enumerate(conv.group.sources):
        for j, entry in enumerate(stream):
            for f in frags[i][j]:
                if f.region.numel:
                    tasks.append(ReadTask(entry, (i, j), f.region, f, _direct(entry, f, dests)))
    return tuple(tasks)
