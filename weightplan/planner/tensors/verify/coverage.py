"""Does a set of fragments cover a destination exactly once? (element-offset arithmetic)

A view's elements are a set of storage offsets. Its innermost dims that are laid out
back to back form runs of consecutive offsets; the fragments cover the destination
exactly once when their runs, sorted, never overlap and merge into the destination's own
runs. Views with more than ``MAX_RUNS`` runs (a transposed write into a big tensor) are
checked by element count and bounds only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter, itemgetter

import torch

from weightplan.planner.core.geometry import Fragment, View, _is_contiguous

MAX_RUNS = 1 << 20
_OFFSET = attrgetter("view.offset")
_VIEW, _SHAPE, _STRIDE, _OFFSET_OF = (attrgetter("view"), attrgetter("shape"), attrgetter("stride"),
                                      attrgetter("offset"))


def runs(view: View) -> tuple[torch.Tensor, int] | None:
    """``(starts, length)``: the view's runs of consecutive offsets, or ``None`` if too many."""
    dims = [(n, s) for n, s in zip(view.shape, view.stride, strict=True) if n != 1]
    length = 1
    while dims and dims[-1][1] == length:
        length *= dims.pop()[0]
    count = math.prod(n for n, _ in dims)
    if count > MAX_RUNS:
        return None
    starts = torch.full((1,), view.offset, dtype=torch.int64)
    for n, s in dims:
        starts = (starts[:, None] + torch.arange(n, dtype=torch.int64) * s).reshape(-1)
    return starts, length


def _merged(starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    breaks = torch.ones_like(starts, dtype=torch.bool)
    breaks[1:] = starts[1:] != ends[:-1]
    first = breaks.nonzero().reshape(-1)
    last = torch.cat([first[1:] - 1, torch.tensor([len(starts) - 1])])
    return starts[first], ends[last]


def coverage_problem(universe: View, fragments: Sequence[Fragment]) -> str | None:
    """``None`` when ``fragments`` cover ``universe`` exactly once, else what is wrong."""
    sizes, total, same, contiguous = _sizes(fragments)
    if total != universe.numel:
        return f"fragments cover {total} of its {universe.numel} elements"
    if not same:
        return "a fragment's region and view differ in size"
    if len(fragments) == 1 and fragments[0].view == universe:
        return None  # the common case: one read or op output fills the whole tensor
    if contiguous and universe.is_contiguous():
        return _contiguous_problem(universe, fragments, sizes)
    if _interleaved(universe, fragments):
        return None
    parts = [runs(f.view) for f in fragments]
    whole = runs(universe)
    if whole is None or any(p is None for p in parts) or not parts:
        return None  # counted above; too many runs to compare exactly
    starts = torch.cat([p[0] for p in parts if p is not None])
    ends = torch.cat([p[0] + p[1] for p in parts if p is not None])
    order = torch.argsort(starts)
    starts, ends = starts[order], ends[order]
    if len(starts) > 1 and bool((starts[1:] < ends[:-1]).any()):
        at = int(starts[1:][starts[1:] < ends[:-1]][0])
        return f"two fragments both write element offset {at}"
    got, want = _merged(starts, ends), _merged(whole[0], whole[0] + whole[1])
    if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
        return "fragments write outside the destination or leave holes in it"
    return None


def _sizes(fragments: Sequence[Fragment]) -> tuple[list[int], int, bool, bool]:
    """Each fragment's element count, their total, whether every region has its view's
    size and whether every view is contiguous. The fragments of a stack share their
    shape, stride and region objects: each run of fragments sharing them is measured once."""
    sizes: list[int] = []
    same = contiguous = True
    shape = stride = region = None
    n = 0
    for f in fragments:
        v, r = f.view, f.region
        if v.shape is not shape or v.stride is not stride or r is not region:
            shape, stride, region = v.shape, v.stride, r
            n = math.prod(shape)
            same = same and r.numel == n
            contiguous = contiguous and v.is_contiguous()
        sizes.append(n)
    return sizes, sum(sizes), same, contiguous


def _interleaved(universe: View, fragments: Sequence[Fragment]) -> bool:
    """``J`` fragments, each ``n`` items of ``m`` contiguous elements ``J * m`` apart, the
    ``j``-th starting ``j * m`` into a contiguous ``universe`` of ``n * J * m`` elements
    (the stacks of a fused gate/up pair): they tile it exactly (the total is checked)."""
    first = fragments[0].view
    shape, stride = first.shape, first.stride
    if not shape or not universe.is_contiguous() or not _is_contiguous(shape[1:], stride[1:]):
        return False
    m = math.prod(shape[1:])
    views = list(map(_VIEW, fragments))
    if list(map(_SHAPE, views)).count(shape) != len(views) or \
            list(map(_STRIDE, views)).count(stride) != len(views) or \
            (shape[0] > 1 and stride[0] != len(views) * m):
        return False
    return sorted(map(_OFFSET_OF, views)) == list(range(universe.offset, universe.offset
                                                          + len(views) * m, m or 1))


def _contiguous_problem(universe: View, fragments: Sequence[Fragment], sizes: list[int]
                        ) -> str | None:
    offsets = list(map(_OFFSET, fragments))
    if offsets == list(accumulate(sizes[:-1], initial=universe.offset)):
        return None  # listed in order, back to back (a stack's): the walk below finds nothing
    end = universe.offset
    runs = sorted(zip(offsets, sizes, strict=True), key=itemgetter(0))
    for offset, n in runs:
        if offset < end:
            return f"two fragments both write element offset {offset}"
        if offset > end:
            return f"no fragment writes element offset {end}"
        end += n
    return None
