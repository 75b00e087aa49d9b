"""``Plan`` and ``WritePlan``: the planner's data plus running, printing and drawing.

The planner's plan types (:class:`~weightplan.planner.pipelines.plan.LoadPlanData`,
:class:`~weightplan.planner.pipelines.write_plan.WritePlanData`) are data only; these
subclasses add what needs the executor and viz, which the planner may not import. Those
are imported by the methods that use them: explaining and printing a plan doesn't load
the executor (nor rich, its progress bar), the DOT, HTML and timeline renderers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from weightplan.api.guard import call_typed
from weightplan.planner.pipelines.plan import LoadPlanData, PlanData
from weightplan.planner.pipelines.write_plan import WritePlanData
from weightplan.viz.style import terminal_text
from weightplan.viz.text import explain_text

if TYPE_CHECKING:
    from weightplan.executor.report import LoadReport, SaveReport

P = TypeVar("P", bound=PlanData)


def promote(cls: type[P], data: PlanData) -> P:
    """``data`` as an instance of its user-facing subclass ``cls`` (same fields)."""
    return cls(**{f.name: getattr(data, f.name) for f in dataclasses.fields(data)})


@dataclasses.dataclass(frozen=True, eq=False)
class Plan(LoadPlanData):
    """A load plan: the mapping, the graph, the schedule, the memory estimate, the problems.

    Build it with :func:`weightplan.explain`; ``print(plan)`` shows it, ``plan.execute()``
    runs it. A plan is immutable: executing it changes the model, never the plan.
    """

    def execute(self, *, strict: bool = False, progress: bool | None = None,
                atomic: bool = False) -> LoadReport:
        """Load the checkpoint into the model as planned.

        Args:
            strict: raise :class:`StrictLoadError` on missing or unexpected keys instead of
                reporting them (shape mismatches always raise, before anything is written).
            progress: show a progress bar; ``None`` shows it only on a terminal.
            atomic: stage tensors that are already allocated and copy them in only when
                every read succeeded, so a failure touches nothing (costs
                ``plan.atomic_bytes`` more memory). Without it, a failure after in-place
                writes raises :class:`PartialLoadError` listing the tensors written.

        Returns:
            A :class:`LoadReport` with bytes read, seconds, GB/s and the peak held.
        """
        from weightplan.executor.execute_load import execute_plan

        return call_typed("execute", execute_plan, self, strict=strict, progress=progress,
                          atomic=atomic)

    def to_dict(self) -> dict[str, Any]:
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

    def __str__(self) -> str:
        return explain_text(self)

    def __repr__(self) -> str:
        return (f"<Plan {terminal_text(self.checkpoint.description)}: "
                f"{len(self.loaded_keys)} tensors, "
                f"peak {self.peak_bytes} B, {len(self.problems)} problems>")


@dataclasses.dataclass(frozen=True, eq=False)
class WritePlan(WritePlanData):
    """What will be written where, decided before a byte is written.

    Build it with :func:`weightplan.explain_save` or :func:`weightplan.explain_convert`;
    ``print(plan)`` shows it, ``plan.execute()`` writes. ``companions``: the source's
    ``config.json`` and generation config, committed next to the shards with them.
    """

    companions: tuple[Path, ...] = ()

    def execute(self, *, progress: bool | None = None) -> SaveReport:
        """Write the checkpoint; a failure leaves no half-written file behind."""
        from weightplan.api.model_config import companion_bytes
        from weightplan.executor.execute_write import execute_write

        files = call_typed("execute", companion_bytes, self.companions)
        return call_typed("execute", execute_write, self, progress=progress, files=files)

    def to_dict(self) -> dict[str, Any]:
        from weightplan.viz.data import write_plan_to_dict

        return write_plan_to_dict(self)

    def __str__(self) -> str:
        text = explain_text(self)
        if self.companions:
            names = ", ".join(p.name for p in self.companions)
            text += terminal_text(f"copies {names} from {self.companions[0].parent} next to "
                                  "the shards") + "\n"
        return text

    def __repr__(self) -> str:
        return (f"<WritePlan {self.direction.value} ({self.inversion.value}) → "
                f"{terminal_text(str(self.directory))}: {len(self.layout.locations)} tensors in "
                f"{len(self.layout.files)} file(s)>")
