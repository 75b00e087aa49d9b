"""``verify``: the invariants of a plan graph and of the steps lowered from it.

Run on what executes, before any byte is read (``torch.fx`` ``Graph.lint`` style: each
message names the node, read or destination and the fix). Checks:

1. the graph (:mod:`~weightplan.planner.tensors.verify.graph_checks`): topological order,
   each kind's arity, attrs and spec rule along every edge, every intermediate consumed,
   one producer per model tensor;
2. every node a step runs is a node of the graph, released when that step is finalized
   (it belongs to exactly one step);
3. every read the executor issues (:mod:`~weightplan.planner.tensors.verify.read_checks`):
   its byte range is its region's, inside its tensor and its file's data section, its
   pieces split it without gaps, a dequantize's scale tiles lie inside the scale;
4. every destination is covered exactly once by the fragments written into it
   (:mod:`~weightplan.planner.tensors.verify.coverage`);
5. the schedule submits every step once and finalizes it once, after submitting it: the
   finalize is where the step's intermediates are released (:func:`check_events`).

Every node, read and fragment is looked at each time: nothing is taken from a summary
made when the plan was built. Ranks planned together share the steps no rank changes (as
objects: :class:`~weightplan.planner.pipelines.lower.Lowered`); checks 3 and 4 of such a
step, a function of the step and the checkpoint alone, are made by the first rank that
verifies it and given to the others (:data:`Checked`). They share every conversion's
front too: check 1 is made once for the graph of the conversions no rank changed, and
for each rank's graph only over the tails it replaced (:mod:`~weightplan.planner.tensors.
verify.derived`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from itertools import chain, compress, repeat
from operator import attrgetter, is_, not_
from types import ModuleType

from weightplan.errors import GraphError
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.nodes import Node
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.schedule.schedule import Event, Events
from weightplan.planner.tensors.verify.coverage import check_coverage
from weightplan.planner.tensors.verify.graph_checks import Picker, Segments, check_graph, picker
from weightplan.planner.tensors.verify.lone_reads import sound_steps
from weightplan.planner.tensors.verify.read_checks import (
    Judged, Sections, read_problems, sections,
)

_LAYOUT, _RUNS, _SCALE_RUNS = attrgetter("layout"), attrgetter("runs"), attrgetter("scale_runs")
_HASH = attrgetter("_hash")  # (Node's hash, kept on it: read without a call)
# id(step) → (the step, the checkpoint it was checked against, its reads' and coverage's
# problems): the verdicts of the steps ranks share, made once
Checked = dict[int, tuple[Step, Checkpoint | None, list[str]]]


@cache
def _strided_checks() -> ModuleType:
    """``strided_checks``, imported by the first plan with strided reads (once)."""
    from weightplan.planner.tensors.verify import strided_checks

    return strided_checks

def verify(graph: PlanGraph, steps: Sequence[Step] = (), checkpoint: Checkpoint | None = None,
           checked: Checked | None = None, proven: Segments | None = None) -> None:
    """Raise :class:`GraphError` listing every broken invariant (see the module docstring);
    ``checked`` keeps the verdicts of the steps other ranks share; ``proven``: the graph's
    segments, proven from the graph other ranks share (:mod:`~weightplan.planner.tensors.
    verify.derived`)."""
    problems = check(graph, steps, checkpoint, checked, proven)
    if problems:
        raise GraphError(problems)


def check(graph: PlanGraph, steps: Sequence[Step] = (), checkpoint: Checkpoint | None = None,
          checked: Checked | None = None, proven: Segments | None = None) -> list[str]:
    """Every broken invariant, as messages (empty: the plan is consistent)."""
    problems, segments = check_graph(graph) if proven is None else ([], proven)
    if problems:  # the steps' checks assume a sound graph
        return problems
    steps = tuple(steps)
    problems = [] if segments is not None and release_holds(segments, steps, graph.distinct) \
        else check_release(graph, steps)
    where = sections(checkpoint)
    judged: Judged = {}  # (the geometries' verdicts, made once for this pass)
    sound = sound_steps(steps, where)  # (a plain key's step, shown sound in columns)
    if checked is None:  # (no other rank to hand the verdicts to)
        for step in compress(steps, map(not_, sound)):
            problems += step_problems(step, where, judged)
        return problems
    for step, shown in zip(steps, sound, strict=True):
        known = checked.get(id(step))
        if known is None or known[0] is not step or known[1] is not checkpoint:
            known = checked[id(step)] = (step, checkpoint,
                                         [] if shown else step_problems(step, where, judged))
        problems += known[2]
    return problems


def step_problems(step: Step, where: Sections, judged: Judged | None = None) -> list[str]:
    """Checks 3 and 4 of one step: its reads, its strided reads, its coverage (``judged``:
    see :func:`read_problems`)."""
    found, landed = read_problems(step, where, {} if judged is None else judged)
    problems = check_coverage(step, landed) + found
    layouts = list(map(_LAYOUT, step.reads))  # (C-level passes: most steps have none)
    if any(map(_RUNS, layouts)) or any(map(_SCALE_RUNS, layouts)):  # strided reads
        problems += _strided_checks().strided_problems(step)
    return problems


def _ran(step: Step) -> list[Node]:
    """The nodes a step runs: its sources, its materialized ops, its sinks."""
    ran = list(chain.from_iterable(step.sources))
    if step.materialize:  # (none when every op places)
        ran += chain.from_iterable(chain.from_iterable(step.materialize))
    ran += step.sinks
    return ran


def release_holds(segments: Segments, steps: Sequence[Step], distinct: bool = False) -> bool:
    """Every node a step runs is, as an object, a node of the segment its first sink is
    in (so of the graph), and no two of them are equal. A step's nodes are found in its
    segment once per proof and count of nodes (the steps of one kind sequence pick them at
    the same places). ``distinct``: no two nodes of the graph are equal (as
    :meth:`PlanGraph.of` made it); then no two run nodes are when no two steps have one
    segment and no step picks a place twice. Else their hashes must differ."""
    found: dict[tuple[int, int], Picker] = {}
    ran_all: list[Node] = []
    homes: list[int] = []
    home, proofs, segment_of = segments.home.get, segments.proofs, segments.segment
    for step in steps:
        k = home(id(step.sinks[0]), -1) if step.sinks else -1
        if k < 0:
            return False
        ran = _ran(step)
        segment, key = segment_of(k), (proofs[k], len(ran))
        pick = found.get(key)
        if pick is None or not all(map(is_, ran, pick(segment))):
            place = dict(zip(map(id, segment), range(len(segment)), strict=True))
            at = list(map(place.get, map(id, ran), repeat(-1)))
            if -1 in at or (distinct and len(set(at)) != len(at)):
                return False
            pick = found[key] = picker(at)
        homes.append(k)
        if not distinct:
            ran_all += ran
    if distinct:  # (each run node is its segment's node at a place only its step picks)
        return len(set(homes)) == len(homes)
    # (no two equal when no two hashes are: equal nodes have equal hashes)
    return len(set(map(_HASH, ran_all))) == len(ran_all)


def check_release(graph: PlanGraph, steps: Iterable[Step]) -> list[str]:
    """Every node a step runs is in the graph and is released by exactly one step."""
    owner: dict[Node, int] = {}
    problems = []
    for s, step in enumerate(steps):
        for node in _ran(step):
            if node not in graph:
                problems.append(f"step {s + 1} ({step.label}) runs {node!r}, which is not in "
                                "the graph; lower steps from the verified graph only")
            elif owner.setdefault(node, s) != s:
                problems.append(f"{node!r} is run by steps {owner[node] + 1} and {s + 1}; it "
                                "would be released twice: give each conversion its own nodes")
    return problems


def check_events(steps: int, events: Sequence[Event]) -> list[str]:
    """Each of ``steps`` steps is submitted once, then finalized once (its release point).
    Read off the event columns (:class:`Events`: no event object is made)."""
    columns = events if isinstance(events, Events) else Events.of(events)
    submitted: set[int] = set()
    finalized: set[int] = set()
    problems = []
    for n, (s, finalize) in enumerate(zip(columns.steps, columns.finalizes, strict=True)):
        if not finalize:
            if s in submitted:
                problems.append(f"event {n}: step {s + 1} is submitted twice; submit each "
                                "step once")
            submitted.add(s)
            continue
        if s not in submitted or s in finalized:
            problems.append(f"event {n}: step {s + 1} is finalized before it is submitted or "
                            "twice; finalize each submitted step once")
        finalized.add(s)
    never = sorted(set(range(steps)) - finalized)
    if never:
        problems.append(f"steps {[s + 1 for s in never][:5]} are never finalized, so their "
                        "intermediates are never released; finalize every step")
    return problems
