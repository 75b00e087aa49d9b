"""The convert direction into memory: ``convert()`` / ``revert()`` on a ``{key: tensor}`` dict.

The same builder, lowering, verification and schedule as every other plan, with memory
sinks: each output is a fresh tensor the executor fills (inline: the sources are in
memory already) and hands back.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightplan.errors import ConflictingTransformError, QuantizationError
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.ir.build import Conversion, SinkKind, build_conversions
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.planner.tensors.ir.quant_scales import add_scale_conversions
from weightplan.planner.pipelines.lower import lower
from weightplan.planner.tensors.schedule.schedule import Schedule
from weightplan.planner.write.reverse import ReverseGroups


@dataclass(frozen=True, eq=False)
class MemoryPlan:
    """Conversions of an in-memory dict, their graph and schedule."""

    checkpoint: Checkpoint
    conversions: tuple[Conversion, ...]
    graph: PlanGraph
    schedule: Schedule


def plan_in_memory(groups: ReverseGroups, checkpoint: Checkpoint,
                   quant: QuantContext | None = None) -> MemoryPlan:
    """Raises :class:`ConflictingTransformError` when two conversions produce one key, and
    :class:`QuantizationError` when scaled FP8 can't follow an op."""
    conversions = build_conversions(groups.groups, groups.outputs, None, SinkKind.MEMORY, quant)
    conversions, problems = add_scale_conversions(conversions, quant, None, SinkKind.MEMORY)
    if problems:
        raise QuantizationError("; ".join(message for _, message in problems))
    seen: set[str] = set()
    for conv in conversions:
        for t in conv.targets:
            if t.key in seen:
                raise ConflictingTransformError(f"two conversions produce {t.key}")
            seen.add(t.key)
    graph, schedule = lower(conversions, checkpoint, order=tuple, threads=0)
    return MemoryPlan(checkpoint, conversions, graph, schedule)
