"""Ops that split and join tensors: Chunk, Concatenate, MergeModulelist, SplitModulelist."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_
from typing import Any

import torch

from weightplan.errors import OpError
from weightplan.planner.core.geometry import (
    Fragment, StackFragments, stack_fragments, stacked_fragments,
)
from weightplan.planner.core.ops.base import (
    ConversionOp, OpContext, Streams, Wiring, flat, normalize_dim, single_input, stream_positions,
)
from weightplan.planner.core.spec import TensorSpec


@dataclass(frozen=True, repr=False)
class Chunk(ConversionOp):
    """Split one tensor along ``dim`` into one piece per target.

    Piece sizes come from the target parameters' shapes (uneven GQA q/k/v splits work);
    when the targets aren't model parameters the pieces are equal. ``sizes`` pins them.
    Inverse: :class:`Concatenate`.
    """

    allocates = False

    dim: int = 0
    sizes: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "Chunk":
        spec = single_input(self, inputs)
        d = normalize_dim(self, self.dim, len(spec.shape))
        total, n = spec.shape[d], len(ctx.target_keys)
        sizes = self.sizes
        if sizes is None:
            sizes = _sizes_from_targets(ctx, d, total)
        if sizes is None:
            if n == 0 or total % n:
                raise OpError(f"{self!r} can't split {list(spec.shape)} (size {total} on dim "
                              f"{d}) into {n} equal pieces for {list(ctx.target_keys)}")
            sizes = (total // n,) * n
        # (pinned sizes need not match the targets: an inverse's Chunk may sit mid-chain)
        if sum(sizes) != total or (self.sizes is None and len(sizes) != n):
            raise OpError(f"{self!r}: sizes {list(sizes)} don't split {total} on dim {d} into "
                          f"{n} targets {list(ctx.target_keys)}")
        return dataclasses.replace(self, dim=d, sizes=tuple(sizes))

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        spec = single_input(self, inputs)
        shape = list(spec.shape)
        out = []
        for size in self.sizes or ():
            shape[self.dim] = size
            out.append((TensorSpec(tuple(shape), spec.dtype),))
        return tuple(out)

    def forward(self, streams):
        (tensor,), = streams
        if self.sizes is None:
            raise OpError(f"{self!r} is not resolved: plan it (or pass sizes=...) first")
        return tuple((piece,) for piece in torch.split(tensor, list(self.sizes), self.dim))

    def wiring(self, inputs) -> Wiring:
        return tuple((((0, 0),),) for _ in self.sizes or ())

    def place(self, outputs, inputs):
        d, offset, frags = self.dim, 0, []
        for (piece,), size in zip(outputs, self.sizes or (), strict=True):
            for f in piece:
                if not f.aligned:
                    return None
                start, stop = f.region.starts[d] + offset, f.region.stops[d] + offset
                frags.append(Fragment(f.region.with_dim(d, start, stop), f.target, f.view))
            offset += size
        return ((tuple(frags),),)

    def inverse(self) -> "Concatenate":
        return Concatenate(self.dim)


def _sizes_from_targets(ctx: OpContext, d: int, total: int) -> tuple[int, ...] | None:
    specs = ctx.target_specs
    known = [s for s in specs if s is not None and len(s.shape) > d]
    if not specs or len(known) != len(specs):
        return None
    sizes = tuple(s.shape[d] for s in known)
    return sizes if sum(sizes) == total else None


@dataclass(frozen=True, repr=False)
class Concatenate(ConversionOp):
    """Concatenate every input tensor (streams in declared order) along ``dim``.

    Inverse: :class:`Chunk` with the input sizes.
    """

    dim: int = 0
    sizes: tuple[int, ...] | None = field(default=None, kw_only=True)

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "Concatenate":
        specs = flat(inputs)
        if not specs:
            raise OpError(f"{self!r} got no tensors")
        d = normalize_dim(self, self.dim, len(specs[0].shape))
        return dataclasses.replace(self, dim=d, sizes=tuple(s.shape[d] for s in specs))

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        specs = flat(inputs)
        first, d = specs[0], self.dim
        for s in specs[1:]:
            rest = [x for i, x in enumerate(s.shape) if i != d]
            want = [x for i, x in enumerate(first.shape) if i != d]
            if len(s.shape) != len(first.shape) or rest != want or s.dtype != first.dtype:
                raise OpError(f"{self!r}: can't concatenate {s} with {first} on dim {d}")
        shape = list(first.shape)
        shape[d] = sum(s.shape[d] for s in specs)
        return ((TensorSpec(tuple(shape), first.dtype),),)

    def forward(self, streams):
        return ((torch.cat(flat(streams), self.dim),),)

    def place(self, outputs, inputs):
        d = self.dim
        (frags,), = outputs
        placed: list[list[tuple[Fragment, ...]]] = []
        offset = 0
        for stream in inputs:
            row = []
            for spec in stream:
                lo_k, hi_k = offset, offset + spec.shape[d]
                mine = []
                for f in frags:
                    if not f.aligned:
                        return None
                    lo, hi = max(lo_k, f.region.starts[d]), min(hi_k, f.region.stops[d])
                    if lo < hi:
                        region = f.region.with_dim(d, lo - lo_k, hi - lo_k)
                        view = f.view.narrow(d, lo - f.region.starts[d], hi - lo)
                        mine.append(Fragment(region, f.target, view))
                row.append(tuple(mine))
                offset = hi_k
            placed.append(row)
        return tuple(tuple(r) for r in placed)

    def wiring(self, inputs) -> Wiring:
        every = tuple((i, j) for i, stream in enumerate(inputs) for j in range(len(stream)))
        return ((every,),)

    def inverse(self) -> Chunk:
        return Chunk(self.dim, sizes=self.sizes)


@dataclass(frozen=True, repr=False)
class MergeModulelist(ConversionOp):
    """Stack each stream's list of tensors (collected by ``*``) along a new axis ``dim``.

    Inverse: :class:`SplitModulelist`.
    """

    dim: int = 0

    def resolve(self, ctx, inputs):
        for stream in inputs:
            if not stream:
                raise OpError(f"{self!r}: a source pattern collected no tensors")
            normalize_dim(self, self.dim, len(stream[0].shape) + 1)
        return self

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        out = []
        for stream in inputs:
            first = stream[0]  # (dequantized experts share one spec: identity first)
            if not all(map(is_, stream, repeat(first))) and any(s != first for s in stream):
                other = next(s for s in stream if s != first)
                raise OpError(f"{self!r}: can't stack {other} with {first}")
            shape = list(first.shape)
            shape.insert(self._dim(len(shape)), len(stream))
            out.append((TensorSpec(tuple(shape), first.dtype),))
        return tuple(out)

    def forward(self, streams):
        return tuple((torch.stack(stream, self._dim(stream[0].dim())),) for stream in streams)

    def _dim(self, ndim_in: int) -> int:
        return self.dim + ndim_in + 1 if self.dim < 0 else self.dim

    def wiring(self, inputs) -> Wiring:
        return tuple((stream_positions(i, len(s)),) for i, s in enumerate(inputs))

    def place(self, outputs, inputs):
        placed = []
        for (frags,), stream in zip(outputs, inputs, strict=True):
            d = self._dim(len(stream[0].shape))
            per_item: list[list[Fragment]] = []
            whole: StackFragments | None = None  # one fragment of a run of items: theirs
            for f in frags:
                if not f.aligned:
                    return None
                if len(frags) == 1:  # (one run of items: the whole stack, or a rank's experts)
                    whole = self._items(f, d, stack_fragments, len(stream))
                    break
                items = self._items(f, d)
                per_item = per_item or [[] for _ in stream]
                for idx, item in enumerate(items, f.region.starts[d]):
                    per_item[idx].append(item)
            placed.append(whole if whole is not None
                          else tuple(map(tuple, per_item or [[] for _ in stream])))
        return tuple(placed)

    @staticmethod
    def _items(f: Fragment, d: int, make: Callable[..., Any] = stacked_fragments,
               *total: int) -> Any:
        """Fragment ``f`` of the stack, split into its items' fragments along ``d`` (by
        ``make``: a list, or, given the ``total`` items, the stack's
        :class:`StackFragments`): one region, shape and stride for every item (shared: a
        stack of 256 experts holds one of each)."""
        start, region, v = f.region.starts[d], f.region.drop(d), f.view
        shape, stride = v.shape[:d] + v.shape[d + 1:], v.stride[:d] + v.stride[d + 1:]
        run = (start, *total) if total else ()
        return make(region, f.target, shape, stride, v.offset, v.stride[d],
                    f.region.stops[d] - start, *run)

    def inverse(self) -> "SplitModulelist":
        return SplitModulelist(self.dim)


@dataclass(frozen=True, repr=False)
class SplitModulelist(ConversionOp):
    """Unbind each stream's tensor along ``dim`` into a list (only ``dim`` is removed).

    Inverse: :class:`MergeModulelist`.
    """

    allocates = False

    dim: int = 0

    def resolve(self, ctx, inputs):
        for stream in inputs:
            if len(stream) != 1:
                raise OpError(f"{self!r} takes one tensor per source pattern, got {len(stream)}")
            normalize_dim(self, self.dim, len(stream[0].shape))
        return self

    def infer(self, inputs: Streams[TensorSpec]) -> Streams[TensorSpec]:
        out = []
        for (spec,) in inputs:
            d = normalize_dim(self, self.dim, len(spec.shape))
            piece = TensorSpec(spec.shape[:d] + spec.shape[d + 1:], spec.dtype)
            out.append((piece,) * spec.shape[d])
        return tuple(out)

    def forward(self, streams):
        return tuple(tuple(t.unbind(self.dim)) for (t,) in streams)

    def wiring(self, inputs) -> Wiring:
        return tuple(tuple(((i, 0),) for _ in range(s[0].shape[self.dim]))
                     for i, s in enumerate(inputs))

    def place(self, outputs, inputs):
        placed = []
        for out_stream, (spec,) in zip(outputs, inputs, strict=True):
            d = normalize_dim(self, self.dim, len(spec.shape))
            mine = []
            for idx, frags in enumerate(out_stream):
                for f in frags:
                    if not f.aligned:
                        return None
                    mine.append(Fragment(f.region.insert(d, idx), f.target, f.view.unsqueeze(d)))
            placed.append((tuple(mine),))
        return tuple(placed)

    def inverse(self) -> MergeModulelist:
        return MergeModulelist(self.dim)
