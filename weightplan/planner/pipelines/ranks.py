"""Every rank's plan and the all-ranks table, from one process and headers only.

``plan_ranks(model, "ckpt/", TensorParallel(world_size=8, rank=0))`` plans each of the 8
ranks as that rank would (a dry run per rank: the same graph, shard nodes, push-down and
schedule), so a cluster load can be checked on a laptop: how many bytes each rank reads,
holds and holds replicated, its peak, and which conversions force whole reads. Nothing is
read but the safetensors headers. At most :data:`weightplan.limits.MAX_PLANNED_RANKS` ranks
are planned in one call (``--tp 1000000`` would plan for half an hour);
:func:`weightplan.viz.ranks.rank_table` prints them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from weightplan.errors import ParallelError
from weightplan.limits import MAX_PLANNED_RANKS
from weightplan.planner.core.sharding.config import TensorParallel
from weightplan.planner.pipelines.plan import LoadPlanData


def plan_ranks(model: torch.nn.Module, checkpoint: object, tp: TensorParallel, *,
               ranks: range | None = None, **explain: object) -> tuple[LoadPlanData, ...]:
    """One load plan per rank of ``tp``'s world (or of ``ranks``), each a dry run: what
    no rank changes is planned once (:func:`~weightplan.planner.pipelines.load.prepare_load`),
    then each rank's plan is made from it as that rank's own load makes it
    (:func:`~weightplan.planner.pipelines.load.rank_plan`)."""
    from weightplan.planner.pipelines.load import prepare_load, rank_plan

    world = tp.world_size if tp.world_size is not None else tp.ranks().world_size
    planned = ranks if ranks is not None else range(world)
    if MAX_PLANNED_RANKS.exceeded_by(len(planned)):  # each rank is a full plan: bound them
        raise ParallelError(f"planning {len(planned)} ranks of a world of {world} in one "
                            f"process (one full plan each) is refused: "
                            f"{MAX_PLANNED_RANKS.hint()}, or plan some of them (ranks=range(...))")
    if not planned:
        return ()
    first = dataclasses.replace(tp, mesh=None, world_size=world, rank=planned[0])
    common = prepare_load(model, checkpoint, tp=first, **explain)  # type: ignore[arg-type]
    assert common.sharding is not None
    return tuple(rank_plan(common, common.sharding if rank == first.rank
                           else dataclasses.replace(common.sharding, rank=rank))
                 for rank in planned)


def read_bytes(plan: LoadPlanData) -> int:
    """The bytes of the regions a rank reads (not the spans enclosing column slices)."""
    return sum(step.needed_bytes for step in plan.schedule.steps)


def network_bytes(plan: LoadPlanData) -> int:
    """Bytes a rank sends and receives in a cooperative load (0 otherwise)."""
    return 0 if plan.exchange is None else plan.exchange.network_bytes


def whole_reads(plan: LoadPlanData) -> tuple[str, ...]:
    """Conversions a rank reads whole because an op can't push its slice down."""
    return tuple(s.label for s in plan.schedule.steps if s.materialize and any(
        d.shard is not None and d.shard.placement.is_sharded for d in s.destinations))


def rank_rows(plans: tuple[LoadPlanData, ...]) -> list[dict[str, Any]]:
    """The table's rows as data (``--json``), each with its rank's problems (as
    ``plan.to_dict()`` lists them)."""
    return [{"rank": p.sharding.rank if p.sharding else 0, "read_bytes": read_bytes(p),
             "storage_bytes": p.read_bytes, "network_bytes": network_bytes(p),
             "held_bytes": p.held_bytes, "replicated_bytes": p.replicated_bytes,
             "peak_bytes": p.peak_bytes,
             "problems": [q.to_dict() for q in p.problems]} for p in plans]
