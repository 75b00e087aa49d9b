"""``Plan``: the planner's load plan data plus running, printing and drawing.

The planner's plan types (:class:`~weightplan.planner.pipelines.plan.LoadPlanData`,
:class:`~weightplan.planner.pipelines.write_plan.WritePlanData`) are data only; ``Plan``
and :class:`~weightplan.api.write_plans.WritePlan` add what needs the executor and viz,
which the planner may not import. Those are imported by the methods that use them:
explaining a plan loads neither the executor (nor rich, its progress bar) nor viz, and
printing it only the text renderer, not the DOT, HTML and timeline ones.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from weightplan.api.guard import call_typed
from weightplan.planner.pipelines.plan import LoadPlanData, PlanData

if TYPE_CHECKING:
    from weightplan.executor.report import LoadReport

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

        With an automatic ``device_map`` spanning several devices (or the disk), the model
        is then dispatched with accelerate's hooks, as transformers does.
        """
        from weightplan.executor.execute_load import execute_plan

        report = call_typed("execute", execute_plan, self, strict=strict, progress=progress,
                            atomic=atomic)
        placement = self.options.placement
        if placement is not None and self.model is not None:
            from weightplan.bridge.offload import dispatch  # (device_map="auto": the hooks)

            call_typed("execute", dispatch, self.model, placement, report.offloaded)
        return report

    def to_dict(self) -> dict[str, Any]:
        """The explanation as plain data (JSON-serializable)."""
        from weightplan.viz.data import plan_to_dict

        return plan_to_dict(self)

    def render(self, path: str, *, detail: str | None = None, only: str | None = None,
               fold: bool | None = None) -> str:
        """Draw the plan graph with graphviz; returns the file written.

        Args:
            path: ``.svg`` / ``.png`` / ``.pdf`` (rendered by graphviz's ``dot`` binary; when
                it is missing the ``.dot`` file is written instead, with a warning saying
                how to render it) or ``.dot``.
            detail: ``"grouped"`` (default) draws repeated layers once as a cluster marked
                ``×N (layers 0..N-1)`` and each expert list as one node; ``"full"`` draws
                every node (the default when ``only`` is given).
            only: a glob over checkpoint and model keys (``"model.layers.3.*"``).
            fold: draw the plain 1:1 copies (one tensor read and assigned under its own
                name) as one counted box; default: for plans of 200+ conversions, without
                ``only``.

        Example:
            >>> plan.render("plan.svg")                                # doctest: +SKIP
            >>> plan.render("layer3.svg", only="model.layers.3.*")     # doctest: +SKIP
        """
        from weightplan.viz.dot import render_plan

        return render_plan(self, path, detail=detail, only=only, fold=fold)

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
        from weightplan.viz.text import explain_text

        return explain_text(self)

    def __repr__(self) -> str:
        from weightplan.terminal import terminal_text
        from weightplan.units import counted, format_bytes

        return (f"<Plan {terminal_text(self.checkpoint.description)}: "
                f"{counted(len(self.loaded_keys), 'tensor')}, "
                f"peak {format_bytes(self.peak_bytes)}, {counted(len(self.problems), 'problem')}>")
