"""Proofs per stack: ``verify``'s coverage and read-range invariants for the reads a step
made in columns (its :class:`~weightplan.planner.tensors.lower.read_tasks.ReadRun` s), shown
once per run from what the run records instead of once per read.

A run whose reads land in a whole stack (its :class:`StackRecord`: item ``k``'s view at
``offset + k * step``, every one of one region, shape and stride) covers what one view
of ``(count, *shape)`` with strides ``(step, *stride)`` covers: when the items' views
are contiguous (one run of offsets each), the stack, as one fragment, stands for its
items in the coverage check (exactly: its runs are the items'). The run's reads must be
the record's fragments (checked, as objects), and its first and last fragments what its
geometry says (checked; :func:`~weightplan.planner.core.geometry.stack_fragments` makes
every fragment from that geometry). A run's reads all have its layout (checked) and read
its entries in order (as the run records; its first and last reads' entries checked):
every read lies inside its entry when the layout lies inside the entries' one spec, and
inside its file's data section when the entries' offsets (per file: the least and the
greatest) do.

Each function vouches only where the exact checks in
:mod:`~weightplan.planner.tensors.verify.verify` would find nothing; where a run records no
stack, its reads are not those of its record, or the arithmetic doesn't hold, it answers
"not proven" and the exact, per-fragment and per-read checks run and word each problem.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter, ne
from typing import TYPE_CHECKING

from weightplan.planner.tensors.verify.coverage import MAX_RUNS
from weightplan.planner.core.geometry import Fragment, Region, View, _is_contiguous

if TYPE_CHECKING:
    from weightplan.planner.inputs.checkpoint import TensorEntry
    from weightplan.planner.core.geometry import StackRecord
    from weightplan.planner.tensors.lower.placement import Step
    from weightplan.planner.tensors.lower.read_tasks import ReadLayout, ReadRun, ReadTask

_FRAGMENT, _LAYOUT = attrgetter("fragment"), attrgetter("layout")
_SPEC, _FILE, _OFFSET = attrgetter("spec"), attrgetter("file"), attrgetter("offset")


def stack_landed(step: Step) -> list[Fragment] | None:
    """The fragments the step's reads land in, each run's stack as one fragment of the
    whole stack (``None``: a run without a stack record, or one its reads or arithmetic
    don't match). Covers exactly what the reads' own fragments cover."""
    reads, landed = step.reads, list[Fragment]()
    at = 0
    for run in step.runs:
        whole = _whole(run, reads[run.start:run.start + run.count])
        if whole is None or run.start < at:
            return None
        landed += filter(None, map(_FRAGMENT, reads[at:run.start]))
        landed.append(whole)
        at = run.start + run.count
    landed += filter(None, map(_FRAGMENT, reads[at:]))
    return landed


def _whole(run: ReadRun, tasks: Sequence[ReadTask]) -> Fragment | None:
    """The one fragment the run's stack covers: a view of ``(count, *shape)``, item ``k``
    at ``offset + k * step``, when each item's view is one run of offsets (so the stack's
    runs are as many as its items, each compared exactly)."""
    stack = run.stack
    if stack is None or not 0 < run.count <= MAX_RUNS or len(tasks) != run.count:
        return None
    shape, stride = stack.shape, stack.stride
    if len(stack.fragments) != run.count or list(map(_FRAGMENT, tasks)) != stack.fragments \
            or stack.region.numel != math.prod(shape) or not _is_contiguous(shape, stride) \
            or not _ends_agree(stack, run.count):
        return None
    whole = (run.count, *shape)
    return Fragment(Region.full(whole), stack.target,
                    View(whole, (stack.step, *stride), stack.offset))


def _ends_agree(stack: StackRecord, count: int) -> bool:
    """The first and the last item's fragments are what the record says they are (the
    items between are made by the same arithmetic, :func:`stack_fragments`)."""
    return all(stack.fragments[k] == Fragment(stack.region, stack.target, View(
        stack.shape, stack.stride, stack.offset + k * stack.step)) for k in (0, count - 1))


def unproven_reads(step: Step, sections: dict[str, tuple[int, int]]) -> Sequence[ReadTask]:
    """The step's reads the exact range check must still look at: those outside its runs
    when every run is proven in bulk, else all of them (problems then in the exact order)."""
    if not step.runs:
        return step.reads
    reads, at = step.reads, 0
    for run in step.runs:  # (in order, apart: the loose reads are the others)
        tasks = reads[run.start:run.start + run.count]
        if run.start < at or len(tasks) != run.count or not run.count or \
                len(run.entries) != run.count or tasks[0].entry is not run.entries[0] or \
                tasks[-1].entry is not run.entries[-1] or \
                list(map(_LAYOUT, tasks)).count(run.layout) != run.count or \
                not entries_hold(run.layout, run.entries, sections):
            return reads
        at = run.start + run.count
    return step.loose_reads


def entries_hold(layout: ReadLayout, entries: Sequence[TensorEntry],
                 sections: dict[str, tuple[int, int]]) -> bool:
    """Every read of ``layout`` lies inside its entry (of ``entries``, all of one spec) and
    inside its file's data section (each run of entries in one file: its least and
    greatest offsets; entries in memory, or in a file without a section: no section)."""
    count = len(entries)
    first, length, pieces = layout.first, layout.length, layout.pieces
    spec = entries[0].spec
    if list(map(_SPEC, entries)).count(spec) != count or not (
            first >= 0 and first + length <= entries[0].nbytes and length == (
                pieces[0][1] if len(pieces) == 1 else sum(n for _, n in pieces))):
        return False
    files, offsets = list(map(_FILE, entries)), list(map(_OFFSET, entries))
    cuts = [0, *compress(range(1, count), map(ne, files[1:], files[:-1])), count]
    for a, b in zip(cuts, cuts[1:], strict=False):
        section = sections.get(files[a]) if files[a] is not None else None
        if section is not None and not (section[0] <= min(offsets[a:b]) + first
                                        and max(offsets[a:b]) + first <= section[1] - length):
            return False
    return True
