"""The :class:`Plan`: everything decided before a byte is read, and the way to run it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx
import torch

from weightplan.device import DeviceMap
from weightplan.planner.tensors.build import Conversion, TargetStatus
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.findings import Findings, Mismatch, Note, Problem
from weightplan.planner.keys.routing import Routing
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.tensors.schedule import MemoryPoint, Schedule
from weightplan.planner.keys.transforms import WeightTransform

if TYPE_CHECKING:
    from weightplan.executor.report import LoadReport


@dataclass(frozen=True)
class PlanOptions:
    """The options a plan was made with."""

    dtype: torch.dtype | None
    threads: int
    budget: int | None
    devices: DeviceMap | None = None  # where meta tensors are loaded (None: the CPU)


class Explained:
    """What load and write plans share: their schedule's figures and the text view."""

    schedule: Schedule

    @property
    def peak_bytes(self) -> int:
        """Estimated peak memory this plan adds to the process (see :mod:`planner.schedule`)."""
        return self.schedule.peak_bytes

    @property
    def read_bytes(self) -> int:
        return sum(p.read_bytes for p in self.schedule.steps)

    def timeline(self) -> tuple[MemoryPoint, ...]:
        """Planned bytes after each scheduled event (see :mod:`planner.schedule`)."""
        return self.schedule.timeline

    def __str__(self) -> str:
        from weightplan.viz.text import explain_text

        return explain_text(self)


@dataclass(frozen=True, eq=False)
class Plan(Explained):
    """A load plan: the mapping, the graph, the schedule, the memory estimate, the problems.

    Build it with :func:`weightplan.explain`; ``print(plan)`` shows it, ``plan.execute()``
    runs it. A plan is immutable: executing it changes the model, never the plan.
    """

    model: torch.nn.Module | None
    checkpoint: Checkpoint
    model_info: ModelInfo | None
    mapping: MappingChoice
    transforms: tuple[WeightTransform, ...]
    routing: Routing
    conversions: tuple[Conversion, ...]
    graph: nx.DiGraph
    schedule: Schedule
    findings: Findings
    options: PlanOptions

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
    def model_bytes(self) -> int:
        """Bytes of the model tensors this plan writes."""
        return sum(d.spec.nbytes for p in self.schedule.steps for d in p.destinations)

    @property
    def loaded_keys(self) -> tuple[str, ...]:
        return tuple(t.key for c in self.conversions for t in c.targets
                     if t.status is TargetStatus.LOAD)

    def execute(self, *, strict: bool = False, progress: bool | None = None) -> "LoadReport":
        """Load the checkpoint into the model as planned.

        Args:
            strict: raise :class:`StrictLoadError` on missing or unexpected keys instead of
                reporting them (shape mismatches always raise, before anything is written).
            progress: show a progress bar; ``None`` shows it only on a terminal.

        Returns:
            A :class:`LoadReport` with bytes read, seconds, GB/s and the peak held.
        """
        from weightplan.executor.execute_load import execute_plan

        return execute_plan(self, strict=strict, progress=progress)

    def to_dict(self) -> dict:
        """The explanation as plain data (JSON-serializable)."""
        from weightplan.viz.data import plan_to_dict

        return plan_to_dict(self)

    def render(self, path: str, *, detail: str | None = None, only: str | None = None) -> str:
        """Draw the plan graph with graphviz; returns the file written.

        Args:
            path: ``.svg`` / ``.png`` / ``.pdf`` (rendered by graphviz's ``dot`` binary; when
                it is missing the ``.dot`` file is written instead, with a warning saying
                how to render it) or ``.dot``.
            detail: ``"grouped"`` (default) draws repeated layers once as a cluster marked
                ``×N (layers 0..N-1)`` and each expert list as one node; ``"full"`` draws
                every node (the default when ``only`` is given).
            only: a glob over checkpoint and model keys (``"model.layers.3.*"``).

        Example:
            >>> plan.render("plan.svg")                                # doctest: +SKIP
            >>> plan.render("layer3.svg", only="model.layers.3.*")     # doctest: +SKIP
        """
        from weightplan.viz.dot import render_plan

        return render_plan(self, path, detail=detail, only=only)

    def render_timeline(self, path: str) -> str:
        """Draw the planned memory per event (resident, in flight, intermediate, the budget,
        the peak and its cause) as an SVG file; returns the file written."""
        from weightplan.viz.timeline import render_timeline

        return render_timeline(self, path)

    def _repr_html_(self) -> str:
        """Jupyter: the grouped table, the graph (when ``dot`` exists) and the timeline."""
        from weightplan.viz.html import plan_html

        return plan_html(self)

    def __repr__(self) -> str:
        return (f"<Plan {self.checkpoint.description}: {len(self.loaded_keys)} tensors, "
                f"peak {self.peak_bytes} B, {len(self.problems)} problems>")
