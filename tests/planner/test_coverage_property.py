"""The coverage check against brute force: every element offset each fragment writes.

``coverage_problem`` proves a lone fragment that is the destination's own contiguous view
at once, and sorts the runs of anything else; both answers must be the brute-force one.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.planner.core.geometry import Region, View
from weightplan.planner.tensors.verify.coverage import Landing, coverage_problem


def _offsets(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> list[int]:
    return [offset + sum(i * s for i, s in zip(index, stride, strict=True))
            for index in product(*map(range, shape))]


@st.composite
def _universe(draw) -> View:
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    order = draw(st.permutations(range(len(shape))))  # identity: contiguous
    stride, acc = [0] * len(shape), 1
    for dim in reversed(order):
        stride[dim], acc = acc, acc * shape[dim]
    return View(shape, tuple(stride), draw(st.integers(0, 3)))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_coverage_is_exactly_once_as_brute_force_counts(data):
    universe = data.draw(_universe())
    shape, stride = universe.shape, universe.stride
    cut = data.draw(st.integers(1, shape[0]))  # slabs of ``cut`` rows along dim 0 (all: whole)
    landed = []
    for start in range(0, shape[0], cut):
        rows = min(cut, shape[0] - start)
        piece = (rows, *shape[1:])
        landed.append(Landing(0, Region.full(piece), piece, stride,
                              [universe.offset + start * stride[0]]))
    how = data.draw(st.sampled_from(["none", "drop", "repeat", "shift", "region", "stride"]))
    victim = landed[data.draw(st.integers(0, len(landed) - 1))]
    if how == "drop" and len(landed) > 1:
        landed.remove(victim)
    elif how == "repeat":
        victim.offsets.append(victim.offsets[0])
    elif how == "shift":
        victim.offsets[0] += data.draw(st.sampled_from([-1, 1, 2]))
    elif how == "region":
        victim.region = Region.full((*victim.shape[:-1], victim.shape[-1] + 1))
    elif how == "stride" and len(stride) > 1:
        victim.stride = stride[::-1]
    written: Counter[int] = Counter()
    for landing in landed:
        for offset in landing.offsets:
            written.update(_offsets(landing.shape, landing.stride, offset))
    exact = (written == Counter(_offsets(shape, stride, universe.offset))
             and all(landing.region.numel == math.prod(landing.shape) for landing in landed))
    assert (coverage_problem(universe, landed) is None) == exact, (universe, landed, how)
