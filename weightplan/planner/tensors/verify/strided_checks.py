"""``verify``'s invariants of strided reads (a read whose layout carries byte runs).

For every read task that reads only runs of its span (and every dequantize that reads
only runs of its scale tiles' span), as the executor reads them:

1. the runs ascend without overlapping, and lie inside the span the read's byte range
   checks hold (so inside the tensor's bytes and its file's data section);
2. they hold exactly the region's bytes: as many as the region has, each run's first and
   last element inside the region's box; with (1), every element of the region is read
   once, so every destination element it lands in is written once.

The runs are a layout's (shared by every read of its geometry: a stack's experts), so each
layout is judged once; the span checks of each read are the byte-range checks'.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import compress
from operator import attrgetter

import numpy as np

from weightplan.planner.core.geometry import CACHE_SIZE, Region
from weightplan.planner.core.sharding.fp8_slices import scale_region
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.lower.read_tasks import ReadLayout, ReadTask
from weightplan.planner.tensors.verify.read_checks import packed_weight_box
from weightplan.planner.tensors.lower.strided import ByteRuns


def strided_problems(step: Step) -> list[str]:
    """What is wrong with the runs of ``step``'s strided reads (see the module docstring)."""
    layouts = list(map(_LAYOUT, step.reads))  # (C-level passes: most steps have none)
    if not any(map(_RUNS, layouts)) and not any(map(_SCALE_RUNS, layouts)):
        return []
    problems: list[str] = []
    judged: dict[tuple[int, int], str | None] = {}
    strided = [a is not None or b is not None
               for a, b in zip(map(_RUNS, layouts), map(_SCALE_RUNS, layouts), strict=True)]
    for task in compress(step.reads, strided):
        key = (id(task.layout), id(task.region))  # (a stack's reads share both objects)
        wrong = judged.get(key, _UNJUDGED)
        if wrong is _UNJUDGED:
            wrong = judged[key] = _layout_problem(task, task.layout)
        if wrong is not None:
            problems.append(f"read of {task.entry.key}: {wrong}")
    return problems


_UNJUDGED = "?"
_LAYOUT, _RUNS, _SCALE_RUNS = attrgetter("layout"), attrgetter("runs"), attrgetter("scale_runs")


def _layout_problem(task: ReadTask, layout: ReadLayout) -> str | None:
    spec = task.entry.spec
    if layout.runs is not None:
        region = task.region if layout.packed is None else packed_weight_box(task)
        wrong = runs_problem(layout.runs, tuple(spec.shape), spec.dtype.itemsize, region,
                             (layout.first, layout.length))
        if wrong is not None:
            return wrong
    scale, attrs = task.scale, task.dequantize
    if layout.scale_runs is not None:
        if scale is None or attrs is None:
            return "it reads runs of a scale but dequantizes nothing; lower it again"
        shape = tuple(scale.spec.shape)
        tiles = scale_region(tuple(spec.shape), shape, task.region, attrs.block)
        first, count = tiles.element_span(shape)
        size = scale.spec.dtype.itemsize
        wrong = runs_problem(layout.scale_runs, shape, size, tiles, (first * size, count * size))
        if wrong is not None:
            return f"its scale tiles: {wrong}"
    return None


@lru_cache(maxsize=CACHE_SIZE)  # (the layers' experts share a few geometries)
def runs_problem(runs: ByteRuns, shape: tuple[int, ...], itemsize: int, region: Region,
                 span: tuple[int, int]) -> str | None:
    """What is wrong with ``runs`` as the reads of ``region`` of a row-major tensor of
    ``shape`` within ``span`` (first byte, bytes), or ``None``."""
    box = "[" + ", ".join(f"{a}:{b}" for a, b in zip(region.starts, region.stops,
                                                     strict=True)) + "]"
    if runs.run <= 0 or runs.run % itemsize:
        return f"its runs of {runs.run} bytes are not whole elements; lower it again"
    if runs.nbytes != region.numel * itemsize:
        return (f"its runs hold {runs.nbytes} bytes, its region {box} "
                f"{region.numel * itemsize}; read each byte of the region once")
    offsets = runs.offsets()
    if len(offsets) > 1 and not bool(np.all(np.diff(offsets) >= runs.run)):
        return "its runs overlap or are out of order; read each byte of the region once"
    low, high = span
    if int(offsets[0]) < low or int(offsets[-1]) + runs.run > low + high:
        return (f"its runs [{int(offsets[0])}, {int(offsets[-1]) + runs.run}) leave its span "
                f"[{low}, {low + high}); lower it again")
    if offsets[0] % itemsize:
        return "its runs don't start on an element; lower it again"
    firsts = np.unravel_index(offsets // itemsize, shape)
    lasts = np.unravel_index((offsets + runs.run) // itemsize - 1, shape)
    # a run is inside the box when both ends are and no index outside the box's innermost
    # partial dimension changes along it (the box's contiguous stretches never cross one)
    partial = [d for d, (a, b) in enumerate(zip(region.starts, region.stops, strict=True))
               if (a, b) != (0, shape[d])]
    inner = partial[-1] if partial else 0
    for dim, (a, b) in enumerate(zip(region.starts, region.stops, strict=True)):
        inside = (firsts[dim] >= a) & (firsts[dim] < b) & (lasts[dim] >= a) & (lasts[dim] < b)
        if dim < inner:
            inside &= firsts[dim] == lasts[dim]
        if not bool(np.all(inside)):
            return f"its runs read bytes outside its region {box}; lower it again"
    return None
