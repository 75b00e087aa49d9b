"""From conversions to what runs: the graph, its steps (lowered and verified), the schedule.

Every direction ends here, so the graph that is drawn is the graph whose steps are
verified, and the verified steps are the ones the schedule orders and the executor runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain

from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.schedule.budget import schedule_within
from weightplan.planner.tensors.ir.build import Conversion
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.lower.placement import PIECE_BYTES, Fronts, Step, plan_step
from weightplan.planner.tensors.schedule.schedule import Schedule, make_schedule
from weightplan.errors import GraphError
from weightplan.planner.tensors.verify.derived import Base, base_of, derived
from weightplan.planner.tensors.verify.graph_checks import Segments
from weightplan.planner.tensors.verify.verify import Checked, check_events, verify

StepOrder = Callable[[Iterable[Step]], tuple[Step, ...]]



def plan_graph(conversions: Sequence[Conversion]) -> PlanGraph:
    """The conversions that load (or show where a mismatch would), as one DAG."""
    return PlanGraph.of(chain.from_iterable(c.nodes for c in conversions if c.in_graph))


class Lowered:
    """The step of each conversion lowered so far, by identity (:func:`plan_step` is a
    function of its conversion): ranks planned together share the conversions no rank
    changes, and lower each of them once. ``base``: every rank's conversions, before any
    rank changed them; each rank's graph is proven from theirs
    (:mod:`~weightplan.planner.tensors.verify.derived`), the fronts they share once."""

    def __init__(self, base: Sequence[Conversion] = ()) -> None:
        self._steps: dict[tuple[int, int], tuple[Conversion, Step]] = {}
        self.checked: Checked = {}  # (verify's verdicts on the shared steps)
        self._conversions = tuple(base)
        self._base: Base | None | bool = False  # (False: not proven yet)
        self._fronts = Fronts()  # (each group's stages, lowered once for the ranks sharing them)

    def graph(self, drawn: Sequence[Conversion]) -> tuple[PlanGraph, Segments | None]:
        """The graph of ``drawn`` (a rank's conversions that are drawn), and its segments
        when they are proven from the base's (``None``: :func:`verify` checks it whole)."""
        if self._base is False:
            self._base = base_of([c.nodes for c in self._conversions if c.in_graph])
        shown = None if not isinstance(self._base, Base) else \
            derived(self._base, [c.nodes for c in drawn])
        return shown if shown is not None else (plan_graph(drawn), None)

    def step(self, conv: Conversion, piece_bytes: int) -> Step:
        key = (id(conv), piece_bytes)
        hit = self._steps.get(key)
        if hit is None or hit[0] is not conv:
            hit = self._steps[key] = (conv, plan_step(conv, piece_bytes, self._fronts))
        return hit[1]


def _lowered(conversions: Sequence[Conversion], piece_bytes: int, memo: Lowered | None
             ) -> Iterator[Step]:
    """The loading conversions' steps, as they are made: the order takes each one's key
    while its reads are still in the CPU cache (a pass over 45k cold reads, later, costs
    twice as much)."""
    for c in conversions:
        if c.loads:
            yield plan_step(c, piece_bytes) if memo is None else memo.step(c, piece_bytes)


def lower(conversions: Sequence[Conversion], checkpoint: Checkpoint, *, order: StepOrder,
          threads: int, budget: int | None = None, piece_bytes: int = PIECE_BYTES,
          share: Callable[[tuple[Step, ...]], tuple[Step, ...]] | None = None,
          memo: Lowered | None = None) -> tuple[PlanGraph, Schedule]:
    """Graph → steps (where bytes land) → :func:`verify` → schedule (order, window, peak).
    ``share`` (a cooperative load's, :mod:`~weightplan.planner.pipelines.cooperative`)
    turns the verified steps other ranks read into steps that receive; ``memo`` keeps
    the steps of the conversions a plan of another rank lowered already.

    Raises:
        GraphError: the graph or a step breaks an invariant (a bug, or a user op's
            ``place`` that doesn't cover its output exactly once).
        BudgetError: no schedule fits ``budget``.
    """
    graph, proven = (plan_graph(conversions), None) if memo is None else \
        memo.graph([c for c in conversions if c.in_graph])
    steps = order(_lowered(conversions, piece_bytes, memo))
    verify(graph, steps, checkpoint, None if memo is None else memo.checked, proven)
    if share is not None:
        steps = share(steps)
    schedule = (make_schedule(steps, threads=threads) if budget is None  # (no budget: nothing to fit)
                else schedule_within(steps, threads=threads, budget=budget))
    problems = check_events(len(schedule.steps), schedule.events)
    if problems:
        raise GraphError(problems)
    return graph, schedule
