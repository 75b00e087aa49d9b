"""Phase 1, the entry point: route every checkpoint key, then group the routes by converter."""

from __future__ import annotations

from collections.abc import Sequence

from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.bulk_groups import bulk_group
from weightplan.planner.keys.router import Router
from weightplan.planner.keys.routing import Routing, _group, check_conflicts
from weightplan.planner.keys.transforms import Renaming, WeightConverter, WeightTransform


@paused_gc
def route_checkpoint(checkpoint: Checkpoint, transforms: Sequence[WeightTransform],
                     model: ModelInfo | None) -> Routing:
    """Route every key of ``checkpoint``; raises for configuration errors."""
    renamings = [t for t in transforms if isinstance(t, Renaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    check_conflicts(renamings, converters)
    routed = Router(renamings, converters, model).route_bulk(checkpoint.entries)
    routes = tuple(routed.routes)
    grouped = bulk_group(routed, checkpoint) if routed.idents is not None else None
    groups, incomplete = grouped if grouped is not None else _group(routes, checkpoint)
    return Routing(routes, groups, incomplete)
