"""Which part of a global tensor one rank holds, as regions and fragments.

A rank's local tensor is made of *pieces*: a box of the global tensor and the offset (on
the sharded dim) where it lands in the local tensor. ``Shard`` gives one piece,
``_StridedShard`` one per block, ``Replicate``/plain the whole tensor. Sizes follow
``torch.chunk`` exactly as DTensor does (``Shard._local_shard_size_and_offset``): chunks of
``ceil(size / world)``, so trailing ranks may get fewer rows, or none.

The pieces become :class:`~weightplan.planner.core.geometry.Fragment`\\ s (global region
→ view of the local tensor), which the ops' ``place`` pushes down to the checkpoint reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.core.sharding.placements import Placement, PlacementKind


def chunk_bounds(size: int, world: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of ``rank``'s chunk when ``torch.chunk`` splits ``size`` in ``world``."""
    if size == 0:
        return 0, 0
    step = -(-size // world)
    return min(size, step * rank), min(size, step * (rank + 1))


@dataclass(frozen=True, slots=True)
class Piece:
    """``region`` of the global tensor lands at ``local_start`` on the sharded dim."""

    region: Region
    local_start: int


def pieces(placement: Placement, shape: tuple[int, ...], world: int, rank: int
           ) -> tuple[Piece, ...]:
    """The boxes of the global tensor ``rank`` holds, in local order."""
    p = placement.normalized(len(shape))
    full = Region.full(shape)
    if not p.is_sharded:
        return (Piece(full, 0),)
    d = p.axis
    blocks = [(0, shape[d])] if p.kind is PlacementKind.SHARD else [
        chunk_bounds(shape[d], p.split_factor, j) for j in range(p.split_factor)]
    out, local = [], 0
    for lo, hi in blocks:
        start, stop = chunk_bounds(hi - lo, world, rank)
        out.append(Piece(full.with_dim(d, lo + start, lo + stop), local))
        local += stop - start
    return tuple(out)


def local_shape(placement: Placement, shape: tuple[int, ...], world: int, rank: int
                ) -> tuple[int, ...]:
    p = placement.normalized(len(shape))
    if not p.is_sharded:
        return tuple(shape)
    d = p.axis
    size = sum(piece.region.shape[d] for piece in pieces(p, shape, world, rank))
    return shape[:d] + (size,) + shape[d + 1:]


def local_fragments(placement: Placement, shape: tuple[int, ...], world: int, rank: int,
                    target: int = 0, stride: tuple[int, ...] | None = None
                    ) -> tuple[Fragment, ...]:
    """Fragments (global region → view of the rank's local tensor) for destination ``target``.

    ``stride`` is the local tensor's (row-major when ``None``). Empty pieces are dropped.
    """
    p = placement.normalized(len(shape))
    local = local_shape(p, shape, world, rank)
    view = View.contiguous(local) if stride is None else View(local, stride)
    frags = []
    for piece in pieces(p, shape, world, rank):
        if piece.region.numel == 0:
            continue
        v = view if not p.is_sharded else view.narrow(
            p.axis, piece.local_start, piece.region.shape[p.axis])
        frags.append(Fragment(piece.region, target, v))
    return tuple(frags)


def slice_local(tensor: torch.Tensor, placement: Placement, world: int, rank: int
                ) -> torch.Tensor:
    """``rank``'s local tensor cut out of a full ``tensor`` (tests and offline sharding)."""
    parts = [tensor[tuple(slice(a, b) for a, b in zip(pc.region.starts, pc.region.stops, strict=True))]
             for pc in pieces(placement, tuple(tensor.shape), world, rank)]
    p = placement.normalized(tensor.dim())
    if len(parts) == 1:
        return parts[0].contiguous()
    return torch.cat(parts, p.axis).contiguous()


def region_nbytes(region: Region, itemsize: int) -> int:
    return region.numel * itemsize
