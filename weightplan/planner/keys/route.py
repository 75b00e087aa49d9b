"""Phase 1, the entry point: route every checkpoint key, then group the routes by converter."""

from __future__ import annotations

from collections.abc import Sequence

from weightplan.errors import ConflictingTransformError
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.groups import group_routes
from weightplan.planner.keys.router import Router
from weightplan.planner.keys.routing import Routing
from weightplan.planner.keys.transforms import (
    Renaming, WeightConverter, WeightRenaming, WeightTransform,
)


@paused_gc
def route_checkpoint(checkpoint: Checkpoint, transforms: Sequence[WeightTransform],
                     model: ModelInfo | None) -> Routing:
    """Route every key of ``checkpoint`` (:mod:`~.router`) and group the routes
    (:mod:`~.groups`); raises for configuration errors (:func:`check_conflicts`, index
    gaps)."""
    renamings = [t for t in transforms if isinstance(t, Renaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    check_conflicts(renamings, converters)
    routed = Router(renamings, converters, model).route_all(list(checkpoint.entries))
    groups, incomplete = group_routes(routed, checkpoint.entries)
    return Routing(tuple(routed.routes), groups, incomplete)


def check_conflicts(renamings: Sequence[Renaming], converters: Sequence[WeightConverter]) -> None:
    """Two converters claiming one pattern, or a renaming that rewrites a converter's output."""
    seen: dict[tuple[str | None, str], WeightConverter] = {}
    for c in converters:
        for pattern in c.source_patterns:
            other = seen.setdefault((c.scope_prefix, pattern), c)
            if other is not c:
                raise ConflictingTransformError(
                    f"two converters claim source pattern {pattern!r}: {other.describe()} and "
                    f"{c.describe()}")
    for r in renamings:
        if not isinstance(r, WeightRenaming):
            continue
        for c in converters:
            for t in c._targets:
                sample = t.expand(("0",) * t.max_group, "0")
                scoped = f"{c.scope_prefix}.{sample}" if c.scope_prefix else sample
                if r.rename(scoped) is not None:
                    raise ConflictingTransformError(
                        f"renaming ({r.describe()}) rewrites {sample!r}, the output of "
                        f"converter ({c.describe()}); renamings run before converters, so it "
                        "would never see that key. Rename the converter's sources or change "
                        "its target instead.")
