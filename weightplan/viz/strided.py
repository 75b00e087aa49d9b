"""The plan's line about strided reads: which column slices read only their rows' runs."""

from __future__ import annotations

from collections.abc import Iterable

from weightplan.planner.tensors.lower.placement import Step
from weightplan.units import format_bytes


def strided_lines(steps: Iterable[Step]) -> list[str]:
    """One line when some file read isn't one run of bytes: how many read only their row
    segments (bytes requested vs their spans) and how many their whole span (the cost
    model's choice, :mod:`~weightplan.planner.tensors.lower.strided`); none otherwise."""
    runs = spans = calls = asked = enclosing = spanned = 0
    for step in steps:
        for task in step.reads:
            layout = task.layout
            if layout.runs is not None:
                runs += 1
                calls += layout.runs.count
                asked += layout.runs.nbytes
                enclosing += layout.length
            elif (task.entry.file is not None and not layout.direct
                  and layout.length > task.region.numel * task.entry.spec.dtype.itemsize):
                spans += 1
                spanned += layout.length
    if not runs and not spans:
        return []
    line = (f"strided reads: {runs} in row segments ({calls} calls, {format_bytes(asked)} of "
            f"{format_bytes(enclosing)} spans)")
    if spans:
        line += f", {spans} as whole spans ({format_bytes(spanned)}: segments too small to pay)"
    return [line]
