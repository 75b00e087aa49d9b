"""Is every destination element written exactly once? (element-offset arithmetic)

A view's elements are a set of storage offsets. Its innermost dims laid out back to back
form runs of consecutive offsets. The fragments a step writes into a destination (its
reads', its materialized ops' outputs', its quantized values') cover it exactly once when
they hold as many elements as it does and their runs, sorted, neither overlap nor leave
the destination's own runs. Fragments are taken a :class:`Landing` at a time: the
consecutive fragments of one geometry (a stack's items share their region, view shape and
stride), whose runs are one shape of runs shifted by each fragment's offset. Views of
more than ``MAX_RUNS`` runs (a transposed write into a big tensor) are checked by
element count only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from itertools import chain, compress, repeat
from operator import add, itemgetter, lt, ne
from types import ModuleType

import torch

from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.lower.placement import Step

MAX_RUNS = 1 << 20
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@dataclass(slots=True)
class Landing:
    """Consecutive fragments of one geometry, landing in destination ``target``: their
    region, their views' shape and stride, and each view's offset."""

    target: int
    region: Region
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offsets: list[int] = field(default_factory=list)


def landings(fragments: Iterable[Fragment]) -> list[Landing]:
    """``fragments`` as landings (a new one wherever the geometry changes, as objects)."""
    out: list[Landing] = []
    last = Landing(-1, Region((), ()), (), ())
    for f in fragments:
        view = f.view
        if view.shape is not last.shape or view.stride is not last.stride or \
                f.region is not last.region or f.target != last.target:
            last = Landing(f.target, f.region, view.shape, view.stride)
            out.append(last)
        last.offsets.append(view.offset)
    return out


@cache
def _quant_steps() -> ModuleType:
    """``quant_steps``, imported by the first step that quantizes (once)."""
    from weightplan.planner.tensors.lower import quant_steps

    return quant_steps


def check_coverage(step: Step, landed: list[Landing]) -> list[str]:
    """Each destination of ``step`` is covered exactly once by what lands in it: ``landed``
    (its reads', as :func:`~weightplan.planner.tensors.verify.read_checks.read_problems`
    found them), its op outputs' and its quantized values' fragments. An op that updates
    its outputs in place (``Step.in_place``) writes over its reads: the reads cover each
    destination once, and so, on their own, do the outputs it updates."""
    if not step.outputs and not step.quantized:  # (every op placed: the reads alone land)
        return _covered(step, landed, _PLACED)
    dests = step.destinations
    outputs = chain.from_iterable(chain.from_iterable(step.outputs))
    if step.in_place:
        return (_covered(step, landed, "the op's place_kept() must map each output element "
                                       "to exactly one kept input")
                + _covered(step, landings(outputs), "the outputs updated in place must be "
                                                    "the destinations, each whole, once"))
    quantized = (_quant_steps().quantize_fragments(q, dests) for q in step.quantized)
    landed = landed + landings(chain(outputs, chain.from_iterable(quantized)))
    return _covered(step, landed, _PLACED)


_PLACED = "the op's place() must map each output element to exactly one input"


def _covered(step: Step, landed: list[Landing], fix: str) -> list[str]:
    """``landed`` covers each destination of ``step`` exactly once, else what is wrong."""
    dests = step.destinations
    into: list[list[Landing]] = [[] for _ in dests]
    for landing in landed:
        if not 0 <= landing.target < len(dests):
            return [f"step {step.label}: a fragment lands in destination #{landing.target}, but "
                    f"the step writes {len(dests)}; lower the step again"]
        into[landing.target].append(landing)
    problems = []
    for dest, found in zip(dests, into, strict=True):
        problem = coverage_problem(dest_view(dest), found)
        if problem is not None:
            problems.append(f"destination {dest.key} of step {step.label}: {problem}; {fix}")
    return problems


def dest_view(dest: Destination) -> View:
    return _view(dest.spec.shape, dest.stride)


# (one view per shape and stride: destinations of one geometry share it)
_view = lru_cache(maxsize=1 << 12)(View)


def coverage_problem(universe: View, landed: list[Landing]) -> str | None:
    """``None`` when the ``landed`` fragments cover ``universe`` exactly once, else what
    is wrong."""
    if len(landed) == 1 and len(landed[0].offsets) == 1 and _is_itself(universe, landed[0]):
        return None  # one fragment: the destination's own (non-overlapping) view, whole
    sizes = [math.prod(landing.shape) for landing in landed]
    total = sum(n * len(landing.offsets) for n, landing in zip(sizes, landed, strict=True))
    if total != universe.numel:
        return f"fragments cover {total} of its {universe.numel} elements"
    if any(landing.region.numel != n for n, landing in zip(sizes, landed, strict=True)):
        return "a fragment's region and view differ in size"
    whole = _shape_runs(tuple(universe.shape), tuple(universe.stride))
    runs = [(_shape_runs(tuple(landing.shape), tuple(landing.stride)), landing.offsets)
            for landing in landed]
    if whole is None or any(found is None for found, _ in runs):
        return None  # counted above; too many runs to compare exactly
    if len(whole[0]) == 1:  # a contiguous destination
        return _contiguous_problem(universe.offset, runs)  # type: ignore[arg-type]
    starts, ends = _spans(runs)  # type: ignore[arg-type]
    overlap = next(compress(starts[1:], map(lt, starts[1:], ends[:-1])), None)
    if overlap is not None:
        return f"two fragments both write element offset {overlap}"
    if _merged(starts, ends) != _merged(*_spans([(whole, [universe.offset])])):
        return "fragments write outside the destination or leave holes in it"
    return None


def _is_itself(universe: View, landing: Landing) -> bool:
    """Whether ``landing`` is one fragment of all of ``universe``'s elements written into
    the view itself, contiguous (so each element once): covered exactly, nothing to sort."""
    shape = landing.shape
    return (landing.offsets[0] == universe.offset and shape == universe.shape
            and landing.stride == universe.stride and universe.is_contiguous()
            and landing.region.numel == universe.numel)


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


Runs = list[tuple[tuple[tuple[int, ...], int], list[int]]]  # (relative runs, length), offsets


def _starts(rel: tuple[int, ...], offsets: list[int]) -> list[int]:
    """The starts of the runs of views of one geometry (``rel`` from each's offset)."""
    if rel == (0,):
        return offsets
    if len(rel) <= len(offsets):
        return list(chain.from_iterable(map(add, offsets, repeat(r)) for r in rel))
    return list(chain.from_iterable(map(add, rel, repeat(o)) for o in offsets))


def _contiguous_problem(first: int, runs: Runs) -> str | None:
    """What is wrong with runs of as many elements as a contiguous destination starting
    at ``first``: walking them sorted, the first one that doesn't start where the last
    ended (runs of one length, as a stack's: their sorted starts compared at once)."""
    lengths = {length for (_, length), _ in runs if length}
    if len(lengths) == 1:
        (length,) = lengths
        starts = sorted(chain.from_iterable(_starts(rel, offsets)
                                            for (rel, n), offsets in runs if n))
        if starts == list(range(first, first + length * len(starts), length)):
            return None
        ends = list(map(add, starts, repeat(length)))
    else:
        starts, ends = _spans(runs)
    at = next(compress(range(len(starts)), map(ne, starts, [first, *ends[:-1]])), None)
    if at is None:
        return None
    end = first if at == 0 else ends[at - 1]
    if starts[at] < end:
        return f"two fragments both write element offset {starts[at]}"
    return f"no fragment writes element offset {end}"


def _spans(runs: Runs) -> tuple[list[int], list[int]]:
    """The starts and ends of every run, sorted (empty runs left out)."""
    spans: list[tuple[int, int]] = []
    for (rel, length), offsets in runs:
        if length:
            starts = _starts(rel, offsets)
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
