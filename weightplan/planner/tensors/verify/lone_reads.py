"""Checks 3 and 4 of the steps that read one tensor into one destination, in columns.

A plain key's step is one read landing in one destination, and a header of many keys has
as many such steps: checked one by one (:func:`~weightplan.planner.tensors.verify.verify.
step_problems`) they cost more than planning them. :func:`sound_steps` shows them sound
in C-level passes over columns of the steps' reads, entries, fragments and destinations,
as :func:`~weightplan.planner.tensors.verify.graph_checks.graph_holds` shows the graph:
what a read's geometry decides (its layout, region, entry spec, fragment, destination spec
and stride: objects a stack's or a shape's steps share) is judged once, by the very checks
``step_problems`` makes (:func:`~.read_checks.judge`, :func:`~.read_checks.landing_problem`,
:func:`~.coverage.coverage_problem`); what each read has of its own (its node and entry,
its offset, its file's data section) is compared in columns. A step not shown sound (any
other step, or one that breaks an invariant) is left to ``step_problems``, which words its
problems: the columns only ever spare a step that has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import add, and_, attrgetter, eq, is_, itemgetter, le, not_

from weightplan.planner.core.geometry import Fragment
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.lower.read_tasks import ReadTask
from weightplan.planner.tensors.verify.coverage import Landing, coverage_problem, dest_view
from weightplan.planner.tensors.verify.read_checks import (
    ANYWHERE, Sections, judge, landing_problem,
)

_READS, _DESTS = attrgetter("reads"), attrgetter("destinations")
_OUTPUTS, _QUANTIZED = attrgetter("outputs"), attrgetter("quantized")
_NODE, _ENTRY, _FRAGMENT = attrgetter("node"), attrgetter("entry"), attrgetter("fragment")
_LAYOUT, _REGION, _SPEC = attrgetter("layout"), attrgetter("region"), attrgetter("spec")
_STRIDE, _KIND, _READ_ENTRY = attrgetter("stride"), attrgetter("kind"), attrgetter("attrs.entry")
_OFFSET, _FILE = attrgetter("offset"), attrgetter("file")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_UNSOUND = (1 << 63, 0)  # (a span no section holds: the read is left to step_problems)


def sound_steps(steps: Sequence[Step], where: Sections) -> list[bool]:
    """Per step, whether it is shown to break none of checks 3 and 4 (see the module
    docstring): one placed read of a READ node into one destination, nothing else landing
    there, its geometry sound and its bytes inside its file's data section."""
    reads, dests = list(map(_READS, steps)), list(map(_DESTS, steps))
    lone = map(and_, map(eq, map(len, reads), repeat(1)), map(eq, map(len, dests), repeat(1)))
    alone = map(and_, map(not_, map(_OUTPUTS, steps)), map(not_, map(_QUANTIZED, steps)))
    at = list(compress(range(len(steps)), map(and_, lone, alone)))
    tasks: list[ReadTask] = [reads[i][0] for i in at]
    nodes = list(map(_NODE, tasks))
    kept = list(map(is_, map(_KIND, nodes), repeat(NodeKind.READ)))  # (no dequantize)
    if not all(kept):
        at, tasks, nodes = (list(compress(c, kept)) for c in (at, tasks, nodes))
    into: list[Destination] = [dests[i][0] for i in at]
    entries: list[TensorEntry] = list(map(_ENTRY, tasks))
    frags = list(map(_FRAGMENT, tasks))
    keys = list(zip(map(id, map(_LAYOUT, tasks)), map(id, map(_REGION, tasks)),
                    map(id, map(_SPEC, entries)), map(id, frags), map(id, map(_SPEC, into)),
                    map(id, map(_STRIDE, into)), strict=True))
    spans = {key: _verdict(tasks[i], entries[i], frags[i], into[i])
             for key, i in dict(zip(keys, range(len(keys)), strict=True)).items()}  # (each judged once)
    found = list(map(spans.__getitem__, keys))
    starts = list(map(add, map(_OFFSET, entries), map(_FIRST, found)))
    sections = list(map(where.get, map(_FILE, entries), repeat(ANYWHERE)))
    inside = map(and_, map(le, map(_FIRST, sections), starts),
                 map(le, map(add, starts, map(_SECOND, found)), map(_SECOND, sections)))
    own = map(is_, entries, map(_READ_ENTRY, nodes))  # (the task reads its node's entry)
    sound = [False] * len(steps)
    for i in compress(at, map(and_, inside, own)):
        sound[i] = True
    return sound


def _verdict(task: ReadTask, entry: TensorEntry, fragment: Fragment | None,
             dest: Destination) -> tuple[int, int]:
    """The span (first byte within the tensor, length) a sound geometry reads; else
    :data:`_UNSOUND`. Sound: read and landed as ``step_problems`` requires, with no strided
    runs (their checks are ``strided_problems``'), covering the destination exactly once."""
    layout = task.layout
    if fragment is None or layout.runs is not None or layout.scale_runs is not None \
            or fragment.target != 0:
        return _UNSOUND
    geometry = judge(task, entry, None)
    if not geometry.sound or landing_problem(task, fragment, (dest,)) is not None:
        return _UNSOUND
    view = fragment.view
    landing = Landing(0, fragment.region, view.shape, view.stride, [view.offset])
    if coverage_problem(dest_view(dest), [landing]) is not None:
        return _UNSOUND
    return geometry.first, geometry.length
