"""Index-space geometry for writing bytes straight into their final place.

A :class:`Region` is a box of an op input (or a checkpoint tensor). A :class:`View` is a
strided window into a destination tensor's storage, in elements. A :class:`Fragment`
says "this region of the tensor lands in that view of destination ``target``". Ops map
fragments of their outputs back to fragments of their inputs (``ConversionOp.place``),
so a read can land directly in the slice of the parameter a merge would put it in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, repeat
from operator import add, mul

from weightplan.planner.core.makers import columns

CACHE_SIZE = 1 << 14  # distinct boxes per plan are few: one per (template, slice)


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return _strides(tuple(shape))


@lru_cache(maxsize=CACHE_SIZE)
def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class View:
    """A strided window (shape, stride, offset in elements) into a destination's storage."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    @classmethod
    def contiguous(cls, shape: tuple[int, ...], offset: int = 0) -> "View":
        return cls(tuple(shape), row_major_strides(tuple(shape)), offset)

    @property
    def numel(self) -> int:
        return _numel(tuple(self.shape))

    def is_contiguous(self) -> bool:
        return _is_contiguous(self.shape, self.stride)

    def narrow(self, dim: int, start: int, length: int) -> "View":
        shape = list(self.shape)
        shape[dim] = length
        return View(tuple(shape), self.stride, self.offset + start * self.stride[dim])

    def select(self, dim: int, index: int) -> "View":
        return View(self.shape[:dim] + self.shape[dim + 1:], self.stride[:dim] + self.stride[dim + 1:],
                    self.offset + index * self.stride[dim])

    def unsqueeze(self, dim: int) -> "View":
        inner = self.stride[dim] * self.shape[dim] if dim < len(self.shape) else 1
        return View(self.shape[:dim] + (1,) + self.shape[dim:],
                    self.stride[:dim] + (inner,) + self.stride[dim:], self.offset)

    def transpose(self, a: int, b: int) -> "View":
        shape, stride = list(self.shape), list(self.stride)
        shape[a], shape[b] = shape[b], shape[a]
        stride[a], stride[b] = stride[b], stride[a]
        return View(tuple(shape), tuple(stride), self.offset)

    def split(self, dim: int, sizes: tuple[int, ...]) -> "View":
        """Split one dim into several (always a view)."""
        inner = row_major_strides(sizes)
        stride = tuple(s * self.stride[dim] for s in inner)
        return View(self.shape[:dim] + sizes + self.shape[dim + 1:],
                    self.stride[:dim] + stride + self.stride[dim + 1:], self.offset)

    def reshaped(self, shape: tuple[int, ...]) -> "View | None":
        """The same elements with another shape, when both are contiguous."""
        if not self.is_contiguous() or math.prod(shape) != self.numel:
            return None
        return View.contiguous(shape, self.offset)


@lru_cache(maxsize=CACHE_SIZE)
def _full(shape: tuple[int, ...]) -> "Region":
    # one shared box per shape: a header of 1M one-tensor keys holds a few hundred shapes
    return Region((0,) * len(shape), shape)


@dataclass(frozen=True, slots=True)
class Region:
    """A box ``[starts, stops)`` in a tensor's index space."""

    starts: tuple[int, ...]
    stops: tuple[int, ...]

    @classmethod
    def full(cls, shape: tuple[int, ...]) -> "Region":
        return _full(tuple(shape)) if cls is Region else cls((0,) * len(shape), tuple(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return _box_shape(self.starts, self.stops)

    @property
    def numel(self) -> int:
        return _box_numel(self.starts, self.stops)

    def is_full(self, shape: tuple[int, ...]) -> bool:
        return self.starts == (0,) * len(shape) and self.stops == tuple(shape)

    def with_dim(self, dim: int, start: int, stop: int) -> "Region":
        return Region(self.starts[:dim] + (start,) + self.starts[dim + 1:],
                      self.stops[:dim] + (stop,) + self.stops[dim + 1:])

    def shifted(self, by: tuple[int, ...]) -> "Region":
        """The same box moved by ``by`` (a region of a part, in the whole's coordinates)."""
        return Region(tuple(a + b for a, b in zip(self.starts, by, strict=True)),
                      tuple(a + b for a, b in zip(self.stops, by, strict=True)))

    def drop(self, dim: int) -> "Region":
        return Region(self.starts[:dim] + self.starts[dim + 1:], self.stops[:dim] + self.stops[dim + 1:])

    def insert(self, dim: int, index: int) -> "Region":
        return Region(self.starts[:dim] + (index,) + self.starts[dim:],
                      self.stops[:dim] + (index + 1,) + self.stops[dim:])

    def swap(self, a: int, b: int) -> "Region":
        starts, stops = list(self.starts), list(self.stops)
        starts[a], starts[b] = starts[b], starts[a]
        stops[a], stops[b] = stops[b], stops[a]
        return Region(tuple(starts), tuple(stops))

    def element_span(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(first, count)``: the contiguous run of elements (row-major) enclosing the box."""
        return _element_span(self.starts, self.stops, tuple(shape))


@lru_cache(maxsize=CACHE_SIZE)
def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, step in reversed(tuple(zip(shape, stride, strict=True))):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


@lru_cache(maxsize=CACHE_SIZE)
def _box_shape(starts: tuple[int, ...], stops: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(b - a for a, b in zip(starts, stops, strict=True))


@lru_cache(maxsize=CACHE_SIZE)
def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@lru_cache(maxsize=CACHE_SIZE)
def _box_numel(starts: tuple[int, ...], stops: tuple[int, ...]) -> int:
    return _numel(_box_shape(starts, stops))


@lru_cache(maxsize=CACHE_SIZE)
def _element_span(starts: tuple[int, ...], stops: tuple[int, ...], shape: tuple[int, ...]
                  ) -> tuple[int, int]:
    if _box_numel(starts, stops) == 0:
        return 0, 0
    strides = _strides(shape)
    first = sum(a * s for a, s in zip(starts, strides, strict=True))
    last = sum((b - 1) * s for b, s in zip(stops, strides, strict=True))
    return first, last - first + 1


@dataclass(frozen=True, slots=True)
class Fragment:
    """``region`` of a tensor lands in ``view`` of destination number ``target``.

    ``view.numel == region.numel``; the region's elements, in row-major order, fill the
    view in row-major order (shapes may differ, e.g. after a reshaping op).
    """

    region: Region
    target: int
    view: View

    @property
    def aligned(self) -> bool:
        """Region and view have the same shape, so ops can keep slicing both together."""
        return self.region.shape == self.view.shape


# Bulk constructors (see planner.makers.columns): a DeepSeek-V3 plan makes ~45k views and
# fragments, one per expert, a stack's at once.
_views, _fragments = columns(View), columns(Fragment)


def stacked_fragments(region: Region, target: int, shape: tuple[int, ...],
                      stride: tuple[int, ...], offset: int, step: int, count: int
                      ) -> list[Fragment]:
    """The fragments of the items of a stack, in order: item ``k``'s ``region`` lands in
    ``View(shape, stride, offset + k * step)`` of destination ``target``; every fragment
    shares ``region``, ``shape`` and ``stride``."""
    offsets = map(add, repeat(offset), map(mul, range(count), repeat(step)))
    views = _views(count, repeat(shape), repeat(stride), offsets)
    return _fragments(count, repeat(region), repeat(target), views)


class StackFragments(tuple[tuple[Fragment, ...], ...]):
    """A stream's fragments as ``place`` returns them (one tuple per item), for a stack
    whose items ``first`` to ``first + len(fragments)`` land one fragment each (every item,
    or one rank's experts; the others land none): item ``first + k``'s is
    ``fragments[k]``, and every one has ``region``, ``target`` and a view of ``shape`` and
    ``stride`` at ``offset + k * step`` (made by :func:`stack_fragments`, so that a reader
    needn't look at each one to know it)."""

    fragments: list[Fragment]
    region: Region
    target: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # item first + k's view starts at offset + k * step
    step: int
    first: int

    def landing(self) -> StackFragments:
        """The items that land, as a stack of their own (itself when every item does)."""
        if len(self.fragments) == len(self):
            return self
        return _stack(self.fragments, self.region, self.target, self.shape, self.stride,
                      self.offset, self.step, 0, 0)


def stack_fragments(region: Region, target: int, shape: tuple[int, ...],
                    stride: tuple[int, ...], offset: int, step: int, count: int,
                    first: int = 0, total: int | None = None) -> StackFragments:
    """:func:`stacked_fragments`, one tuple per item, saying what they share: items
    ``first`` to ``first + count`` of ``total`` (default: ``count``) land, the others none."""
    fragments = stacked_fragments(region, target, shape, stride, offset, step, count)
    after = 0 if total is None else total - first - count
    return _stack(fragments, region, target, shape, stride, offset, step, first, after)


def _stack(fragments: list[Fragment], region: Region, target: int, shape: tuple[int, ...],
           stride: tuple[int, ...], offset: int, step: int, first: int, after: int
           ) -> StackFragments:
    made = StackFragments(chain(repeat((), first), zip(fragments), repeat((), after)))
    made.fragments, made.region, made.target = fragments, region, target
    made.shape, made.stride, made.offset, made.step = shape, stride, offset, step
    made.first = first
    return made
