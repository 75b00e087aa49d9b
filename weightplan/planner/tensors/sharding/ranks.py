"""Per-rank plans and the all-ranks table, from one process and headers only.

``rank_table(model, "ckpt/", world_size=8)`` answers, for a cluster load planned on a
laptop: how many bytes each of the 8 ranks reads, holds, and holds replicated; which
conversions force whole reads. Nothing is read but the safetensors headers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from weightplan.parallel import TensorParallel
from weightplan.planner.inputs.checkpoint import Checkpoint, open_checkpoint
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.keys.routing import route_checkpoint
from weightplan.planner.keys.transforms import LEGACY
from weightplan.planner.tensors.build import build_conversions
from weightplan.planner.tensors.sharding.pushdown import ShardedProgram, shard_program
from weightplan.planner.tensors.sharding.resolve import ShardingPlan, resolve_sharding
from weightplan.units import format_bytes


@dataclass(frozen=True)
class RankPlan:
    """What one rank does: its programs, and the sharding they follow."""

    world_size: int
    rank: int
    sharding: ShardingPlan
    programs: tuple[ShardedProgram, ...]
    checkpoint_bytes: int
    checkpoint: Checkpoint

    @property
    def read_bytes(self) -> int:
        return sum(p.read_bytes for p in self.programs)

    @property
    def held_bytes(self) -> int:
        return sum(p.held_bytes for p in self.programs)

    @property
    def replicated_bytes(self) -> int:
        return sum(p.replicated_bytes for p in self.programs)

    @property
    def peak_bytes(self) -> int:
        """Held parameters plus the largest group read whole and converted in memory."""
        transient = [p.program.held_bytes + p.program.convert_bytes for p in self.programs]
        return self.held_bytes + max(transient, default=0)

    @property
    def whole_reads(self) -> tuple[str, ...]:
        return tuple(p.program.conversion.label for p in self.programs if p.whole)


def plan_ranks(model: torch.nn.Module, checkpoint: object, tp: TensorParallel, *,
               ranks: range | None = None, mapping: object = None,
               dtype: torch.dtype | None = None) -> tuple[RankPlan, ...]:
    """One :class:`RankPlan` per rank (all ranks of ``tp``'s world unless ``ranks``)."""
    from weightplan.planner.explain import choose_mapping

    world = tp.ranks().world_size
    ckpt = open_checkpoint(checkpoint)
    info = inspect_model(model)
    choice = choose_mapping(mapping, model)
    transforms = choice.transforms + tuple(t for t in LEGACY if t not in choice.transforms)
    routing = route_checkpoint(ckpt, transforms, info)
    conversions = [c for c in build_conversions(routing.groups, info, dtype) if c.loads]
    sharding = resolve_sharding(model, tp, world)
    total = sum(e.spec.nbytes for c in conversions for e in c.group.entries)
    out = []
    for rank in ranks if ranks is not None else range(world):
        programs = tuple(shard_program(c, sharding.placement, world, rank) for c in conversions)
        out.append(RankPlan(world, rank, sharding, programs, total, ckpt))
    return tuple(out)


def rank_table(plans: tuple[RankPlan, ...]) -> str:
    """A text table: one row per rank (read, held, replicated, peak, read / (total/N))."""
    if not plans:
        return "no ranks"
    world, total = plans[0].world_size, plans[0].checkpoint_bytes
    head = (f"tensor parallel over {world} ranks ({plans[0].sharding.source}); checkpoint "
            f"{format_bytes(total)}, 1/{world} = {format_bytes(total // world)}")
    rows = [f"{'rank':>4}  {'read':>10}  {'held':>10}  {'replicated':>10}  {'peak':>10}  "
            f"{'read/(total/N)':>14}"]
    for p in plans:
        ratio = p.read_bytes / (total / world) if total else 0.0
        rows.append(f"{p.rank:>4}  {format_bytes(p.read_bytes):>10}  "
                    f"{format_bytes(p.held_bytes):>10}  {format_bytes(p.replicated_bytes):>10}  "
                    f"{format_bytes(p.peak_bytes):>10}  {ratio:>14.3f}")
    notes = [f"problem: {i.key}: {i.message}" for i in plans[0].sharding.issues]
    whole = plans[0].whole_reads
    if whole:
        notes.append(f"read whole (an op can't take a slice): {', '.join(whole[:5])}"
                     f"{' ...' if len(whole) > 5 else ''}")
    return "\n".join([head, *rows, *notes])
