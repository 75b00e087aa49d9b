"""What every plan is: a direction, its sources, one verified graph and its schedule.

Load, save and on-disk convert are three :class:`Direction` s of one pipeline: routed
groups → conversions (nodes) → :class:`~weightplan.planner.tensors.ir.graph.PlanGraph` →
steps (lowered, verified) → :class:`~weightplan.planner.tensors.schedule.schedule.Schedule`. The
plan types here are data only; the user-facing ``Plan`` / ``WritePlan`` that execute,
print and draw them live above the planner, in :mod:`weightplan.api`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import torch

from weightplan.planner.inputs.device import DeviceMap
from weightplan.planner.core.problems import Mismatch, Note, Problem
from weightplan.planner.pipelines.findings import Findings
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.routing import Routing
from weightplan.planner.keys.transforms import WeightTransform
from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.schedule.schedule import Schedule, Timeline

if TYPE_CHECKING:  # (a plain load's plan imports no adapter, device-map or cooperative module)
    from weightplan.planner.tensors.ir.shard_nodes import Sharding
    from weightplan.planner.pipelines.adapter_summary import AdapterSummary
    from weightplan.planner.pipelines.cooperative import Exchange
    from weightplan.planner.tensors.schedule.dequant_side import DequantPlacement
    from weightplan.planner.tensors.schedule.device_plan import DevicePlacement


class Direction(Enum):
    """Which way a plan runs the pipeline."""

    LOAD = "load"  # checkpoint → model tensors
    SAVE = "save"  # model tensors → checkpoint files (inverse transforms)
    CONVERT = "convert"  # checkpoint → checkpoint (files, or an in-memory dict)


@dataclass(frozen=True)
class PlanOptions:
    """The options a plan was made with."""

    dtype: torch.dtype | None
    threads: int
    budget: int | None
    devices: DeviceMap | None = None  # where meta tensors are loaded (None: the CPU)
    placement: DevicePlacement | None = None  # device_map="auto" & co.: the placement made
    dequantize: DequantPlacement | None = None  # where each FP8 dequantize runs


@dataclass(frozen=True, eq=False)
class PlanData:
    """What every direction's plan holds; everything else is derived from ``graph``."""

    direction: Direction
    checkpoint: Checkpoint  # the sources: checkpoint files, or the model's tensors
    mapping: MappingChoice
    transforms: tuple[WeightTransform, ...]
    conversions: tuple[Conversion, ...]
    graph: PlanGraph
    schedule: Schedule
    options: PlanOptions

    @property
    def peak_bytes(self) -> int:
        """Estimated peak memory this plan adds to the process (see :mod:`planner.schedule`)."""
        return self.schedule.peak_bytes

    @property
    def read_bytes(self) -> int:
        return sum(p.read_bytes for p in self.schedule.steps)

    @property
    def model_bytes(self) -> int:
        """Bytes of the destination tensors this plan writes."""
        return sum(d.spec.nbytes for p in self.schedule.steps for d in p.destinations)

    def timeline(self) -> Timeline:
        """Planned bytes after each scheduled event (see :mod:`planner.schedule`)."""
        return self.schedule.timeline


@dataclass(frozen=True, eq=False)
class LoadPlanData(PlanData):
    """A load plan: the model side, the routing and the findings on top of the graph."""

    model: torch.nn.Module | None
    model_info: ModelInfo | None
    routing: Routing
    findings: Findings
    sharding: Sharding | None = None  # tensor parallel: this rank's plan
    exchange: Exchange | None = None  # cooperative reads: what is broadcast, by whom
    adapter: AdapterSummary | None = None  # the adapter this plan loads, if any

    @property
    def held_bytes(self) -> int:
        """Bytes of the tensors this rank keeps (its shards and the replicated tensors)."""
        return sum(d.spec.nbytes for p in self.schedule.steps for d in p.destinations
                   if d.written)

    @property
    def replicated_bytes(self) -> int:
        """The part of :attr:`held_bytes` every rank holds whole."""
        return sum(d.spec.nbytes for p in self.schedule.steps for d in p.destinations
                   if d.written and (d.shard is None or not d.shard.placement.is_sharded))

    @property
    def missing(self) -> frozenset[str]:
        """Model tensors (canonical names) the checkpoint does not produce."""
        return self.findings.missing

    @property
    def unexpected(self) -> frozenset[str]:
        """Checkpoint keys with no model tensor to go to."""
        return self.findings.unexpected

    @property
    def mismatched(self) -> Mapping[str, Mismatch]:
        """Model key → (checkpoint shape after ops, model shape)."""
        return self.findings.mismatched

    @property
    def problems(self) -> tuple[Problem, ...]:
        return self.findings.problems

    @property
    def notes(self) -> tuple[Note, ...]:
        return self.findings.notes

    @property
    def loaded_keys(self) -> tuple[str, ...]:
        return tuple(t.key for c in self.conversions for t in c.targets
                     if t.status is TargetStatus.LOAD)

    @property
    def device_map(self) -> dict[str, str] | None:
        """``{module: device}`` of an automatic placement (``device_map="auto"``), as
        accelerate's ``dispatch_model`` takes it; ``None`` without one."""
        placement = self.options.placement
        return None if placement is None else dict(placement.device_map)

    @property
    def device_peaks(self) -> dict[str, int] | None:
        """``{device: planned peak bytes}`` of an automatic placement (weights + the
        load's staging and temporaries there); ``None`` without one."""
        placement = self.options.placement
        return None if placement is None else placement.peaks

    @property
    def atomic_bytes(self) -> int:
        """Extra memory ``execute(atomic=True)`` holds: one copy of every tensor written
        in place (already allocated in the model)."""
        seen = {d.key: d.spec.nbytes for step in self.schedule.steps
                for d in step.destinations if not d.allocates}
        return sum(seen.values())
