"""Is every destination element written exactly once? (element-offset arithmetic)

A view's elements are a set of storage offsets. Its innermost dims laid out back to back
form runs of consecutive offsets. The fragments a step writes into a destination (its
reads', its materialized ops' outputs', its quantized values') cover it exactly once when
they hold as many elements as it does and their runs, sorted, neither overlap nor leave
the destination's own runs. Fragments are taken a geometry at a time (the items of a
stack share their region, shape and stride): one run shape per geometry, its starts
shifted by each fragment's offset. Views of more than ``MAX_RUNS`` runs (a transposed
write into a big tensor) are checked by element count only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain, compress, repeat
from operator import add, attrgetter, itemgetter, lt, ne, or_

import torch

from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.lower.quant_steps import quantize_fragments

MAX_RUNS = 1 << 20
_VIEW, _REGION, _TARGET = attrgetter("view"), attrgetter("region"), attrgetter("target")
_SHAPE, _STRIDE, _OFFSET = attrgetter("shape"), attrgetter("stride"), attrgetter("offset")
_STARTS, _STOPS = attrgetter("starts"), attrgetter("stops")
_FRAGMENT, _FIRST, _SECOND = attrgetter("fragment"), itemgetter(0), itemgetter(1)


def check_coverage(step: Step) -> list[str]:
    """Each destination of ``step`` is covered exactly once by the fragments written into
    it: its reads' (as the executor writes them), its op outputs' and quantized values'."""
    landed = list(filter(None, map(_FRAGMENT, step.reads)))
    landed += chain.from_iterable(chain.from_iterable(step.outputs))
    for quantized in step.quantized:
        landed += quantize_fragments(quantized, step.destinations)
    dests = step.destinations
    targets = list(map(_TARGET, landed))
    if targets.count(0) == len(targets) and len(dests) == 1:
        into = [landed]  # (one destination, every fragment in it)
    else:
        into = [[] for _ in dests]
        for fragment, target in zip(landed, targets, strict=True):
            if not 0 <= target < len(dests):
                return [f"step {step.label}: a fragment lands in destination #{target}, but "
                        f"the step writes {len(dests)}; lower the step again"]
            into[target].append(fragment)
    problems = []
    for dest, fragments in zip(dests, into, strict=True):
        problem = coverage_problem(dest_view(dest), fragments)
        if problem is not None:
            problems.append(f"destination {dest.key} of step {step.label}: {problem}; the "
                            "op's place() must map each output element to exactly one input")
    return problems


def dest_view(dest: Destination) -> View:
    return View(dest.spec.shape, dest.stride)


def coverage_problem(universe: View, fragments: Sequence[Fragment]) -> str | None:
    """``None`` when ``fragments`` cover ``universe`` exactly once, else what is wrong."""
    views = list(map(_VIEW, fragments))
    regions = list(map(_REGION, fragments))
    groups = _geometries(views, regions)
    total, same = 0, True
    for a, b in groups:
        n = views[a].numel
        total += n * (b - a)
        same = same and regions[a].numel == n
    if total != universe.numel:
        return f"fragments cover {total} of its {universe.numel} elements"
    if not same:
        return "a fragment's region and view differ in size"
    whole = _shape_runs(tuple(universe.shape), tuple(universe.stride))
    runs = [(_shape_runs(tuple(views[a].shape), tuple(views[a].stride)), a, b) for a, b in groups]
    if whole is None or any(found is None for found, _, _ in runs):
        return None  # counted above; too many runs to compare exactly
    if len(whole[0]) == 1:  # a contiguous destination
        return _contiguous_problem(universe.offset, views, runs)  # type: ignore[arg-type]
    starts, ends = _spans(views, runs)  # type: ignore[arg-type]
    overlap = next(compress(starts[1:], map(lt, starts[1:], ends[:-1])), None)
    if overlap is not None:
        return f"two fragments both write element offset {overlap}"
    want = _spans([View(universe.shape, universe.stride, universe.offset)], [(whole, 0, 1)])
    if _merged(starts, ends) != _merged(*want):
        return "fragments write outside the destination or leave holes in it"
    return None


def _geometries(views: list[View], regions: list[Region]) -> list[tuple[int, int]]:
    """``[a, b)`` ranges of consecutive fragments of one geometry: equal regions, view
    shapes and strides (the items of a stack)."""
    count = len(views)
    if count < 2:
        return [(0, count)] if count else []
    columns = (list(map(_SHAPE, views)), list(map(_STRIDE, views)),
               list(map(_STARTS, regions)), list(map(_STOPS, regions)))
    if all(column.count(column[0]) == count for column in columns):
        return [(0, count)]
    changed = [False] * (count - 1)
    for column in columns:
        changed = list(map(or_, changed, map(ne, column[1:], column[:-1])))
    cuts = [0, *compress(range(1, count), changed), count]
    return list(zip(cuts, cuts[1:], strict=False))


@lru_cache(maxsize=1 << 12)
def _shape_runs(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """The runs of a view of ``shape`` and ``stride`` at offset 0: their starts and their
    common length (``None``: more than ``MAX_RUNS`` of them)."""
    dims = [(n, s) for n, s in zip(shape, stride, strict=True) if n != 1]
    length = 1
    while dims and dims[-1][1] == length:
        length *= dims.pop()[0]
    if math.prod(n for n, _ in dims) > MAX_RUNS:
        return None
    starts = torch.zeros(1, dtype=torch.int64)
    for n, s in dims:
        starts = (starts[:, None] + torch.arange(n, dtype=torch.int64) * s).reshape(-1)
    return tuple(starts.tolist()), length


Runs = list[tuple[tuple[tuple[int, ...], int], int, int]]  # (relative runs, length), [a, b)


def _starts(views: list[View], rel: tuple[int, ...], a: int, b: int) -> list[int]:
    """The starts of the runs of views ``a .. b - 1`` (one geometry: ``rel`` from each's offset)."""
    offsets = list(map(_OFFSET, views[a:b]))
    if rel == (0,):
        return offsets
    if len(rel) <= len(offsets):
        return list(chain.from_iterable(map(add, offsets, repeat(r)) for r in rel))
    return list(chain.from_iterable(map(add, rel, repeat(o)) for o in offsets))


def _contiguous_problem(first: int, views: list[View], runs: Runs) -> str | None:
    """What is wrong with runs of as many elements as a contiguous destination starting
    at ``first``: walking them sorted, the first one that doesn't start where the last
    ended (runs of one length, as a stack's: their sorted starts compared at once)."""
    lengths = {length for (_, length), _, _ in runs if length}
    if len(lengths) == 1:
        (length,) = lengths
        starts = sorted(chain.from_iterable(_starts(views, rel, a, b)
                                            for (rel, n), a, b in runs if n))
        if starts == list(range(first, first + length * len(starts), length)):
            return None
        ends = list(map(add, starts, repeat(length)))
    else:
        starts, ends = _spans(views, runs)
    at = next(compress(range(len(starts)), map(ne, starts, [first, *ends[:-1]])), None)
    if at is None:
        return None
    end = first if at == 0 else ends[at - 1]
    if starts[at] < end:
        return f"two fragments both write element offset {starts[at]}"
    return f"no fragment writes element offset {end}"


def _spans(views: list[View], runs: Runs) -> tuple[list[int], list[int]]:
    """The starts and ends of every run, sorted (empty runs left out)."""
    spans: list[tuple[int, int]] = []
    for (rel, length), a, b in runs:
        if length:
            starts = _starts(views, rel, a, b)
            spans += zip(starts, map(add, starts, repeat(length)), strict=True)
    spans.sort()
    return list(map(_FIRST, spans)), list(map(_SECOND, spans))


def _merged(starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """Back-to-back runs joined."""
    out: list[tuple[int, int]] = []
    for s, e in zip(starts, ends, strict=True):
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out
