"""Checks 3 and 4 of the steps that read one tensor into one destination, shown at once.

A plain key's step is one read landing in one destination, and a header of many keys has
as many such steps: checked one by one (:func:`~weightplan.planner.tensors.verify.verify.
step_problems`) they cost more than planning them. :func:`sound_steps` shows them sound
in one pass, as :func:`~weightplan.planner.tensors.verify.graph_checks.graph_holds` shows
the graph: what a read's geometry decides (its layout, region, entry spec, fragment,
destination spec and stride: objects the steps of one shape share) is judged once, by the
very checks ``step_problems`` makes (:func:`~.read_checks.judge`,
:func:`~.read_checks.landing_problem`, :func:`~.coverage.coverage_problem`); what each
read has of its own (its node and entry, its offset, its file's data section) is compared
read by read. A step not shown sound (any other step, or one that breaks an invariant) is
left to ``step_problems``, which words its problems: the proof only ever spares a step
that has none.
"""

from __future__ import annotations

from collections.abc import Sequence

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

_UNSOUND = (1 << 63, 0)  # (a span no section holds: the read is left to step_problems)


def sound_steps(steps: Sequence[Step], where: Sections) -> list[bool]:
    """Per step, whether it is shown to break none of checks 3 and 4 (see the module
    docstring): one placed read of a READ node into one destination, nothing else landing
    there, its geometry sound and its bytes inside its file's data section. (One pass over
    the steps: the plan's objects are cold by now, and a pass per attribute reads each of
    them from memory again.)"""
    sound = [False] * len(steps)
    spans: dict[tuple[int, ...], tuple[int, int]] = {}  # (each geometry judged once)
    get, read = where.get, NodeKind.READ
    for i, step in enumerate(steps):
        reads, dests = step.reads, step.destinations
        if len(reads) != 1 or len(dests) != 1 or step.outputs or step.quantized:
            continue
        task = reads[0]
        node, entry, fragment, dest = task.node, task.entry, task.fragment, dests[0]
        if node.kind is not read or node.attrs.entry is not entry:  # type: ignore[union-attr]
            continue  # (a dequantize; a task carrying another entry than its node's)
        key = (id(task.layout), id(task.region), id(entry.spec), id(fragment), id(dest.spec),
               id(dest.stride))
        span = spans.get(key)
        if span is None:
            span = spans[key] = _verdict(task, entry, fragment, dest)
        low, high = get(entry.file, ANYWHERE)  # type: ignore[arg-type]
        first = entry.offset + span[0]
        sound[i] = low <= first and first + span[1] <= high
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
