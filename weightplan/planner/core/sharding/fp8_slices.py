"""FP8 block-quantized weights under sharding: read the slice and only its scale blocks.

A DeepSeek-V3-style weight ``W`` (float8, ``[rows, cols]``) has ``weight_scale_inv`` on a
*ceil* grid of ``block`` tiles: scale ``[i, j]`` covers rows ``[i*bm, (i+1)*bm)`` and cols
``[j*bn, (j+1)*bn)``, the last tile possibly partial. A rank that needs the box
``[r0, r1) × [c0, c1)`` of ``W`` reads exactly that box of fp8 bytes and the scale tiles
``[r0 // bm, ceil(r1 / bm)) × [c0 // bn, ceil(c1 / bn))``; dequantizing the box offsets the
expanded scales by ``r0 % bm`` / ``c0 % bn``. Nothing assumes the box is tile-aligned, so a
64-row shard of a 128-row tile, or an empty shard, is exact (transformers 5.23 derives the
tile from the *sliced* scale grid and divides by zero there).
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import TYPE_CHECKING

import torch

from weightplan.planner.core.geometry import Region

if TYPE_CHECKING:  # (tensor parallelism's: a plain FP8 load reads its tiles without them)
    from types import ModuleType

    from weightplan.planner.core.sharding.placements import Placement

BLOCK = (128, 128)


def scale_shape(weight_shape: tuple[int, ...], block: tuple[int, int] = BLOCK
                ) -> tuple[int, ...]:
    """The ceil grid of a weight's scale (leading dims, e.g. experts, kept)."""
    *lead, rows, cols = weight_shape
    return (*lead, -(-rows // block[0]), -(-cols // block[1]))


def covering_blocks(region: Region, block: tuple[int, int] = BLOCK) -> Region:
    """The scale tiles a weight box needs (empty box → empty scale region)."""
    *lead_s, r0, c0 = region.starts
    *lead_e, r1, c1 = region.stops
    if region.numel == 0:
        return Region((*lead_s, r0 // block[0], c0 // block[1]),
                      (*lead_s, r0 // block[0], c0 // block[1]))
    return Region((*lead_s, r0 // block[0], c0 // block[1]),
                  (*lead_e, -(-r1 // block[0]), -(-c1 // block[1])))


def dequantize_box(q: torch.Tensor, scale: torch.Tensor, region: Region,
                   dtype: torch.dtype, block: tuple[int, int] = BLOCK) -> torch.Tensor:
    """Dequantize ``q`` (the weight box ``region``) with ``scale`` (its covering tiles)."""
    rows, cols = q.shape[-2], q.shape[-1]
    if q.numel() == 0:
        return torch.empty(q.shape, dtype=dtype)
    dr, dc = region.starts[-2] % block[0], region.starts[-1] % block[1]
    expanded = scale.float().repeat_interleave(block[0], dim=-2)
    expanded = expanded.repeat_interleave(block[1], dim=-1)
    expanded = expanded[..., dr:dr + rows, dc:dc + cols]
    return (q.float() * expanded).to(dtype)


def box_bytes(region: Region, weight_itemsize: int = 1, scale_itemsize: int = 4,
              block: tuple[int, int] = BLOCK) -> int:
    """Bytes a rank reads for a weight box: the fp8 box plus its covering scale tiles."""
    return region.numel * weight_itemsize + covering_blocks(region, block).numel * scale_itemsize


@lru_cache(maxsize=1024)  # (one answer per geometry: the layers' weights share a few)
def scale_split_problem(placement: Placement, weight_shape: tuple[int, ...],
                        scale_shape: tuple[int, ...], world: int,
                        block: tuple[int, int] = BLOCK) -> str | None:
    """Why ``placement`` can't split a kept FP8 weight and its scale alike, or ``None``.

    Each rank's scale pieces (the scale grid split as DTensor splits it) must be exactly
    the tiles covering its weight pieces; otherwise some rank would hold a weight slice
    whose scales sit on another rank (e.g. 128 rows over 2 ranks: 64 rows each, one scale
    row, which DTensor gives to rank 0 alone). Every rank is checked, so all ranks agree.
    """
    if not placement.is_sharded:
        return None
    pieces = _shard_math().pieces
    for rank in range(world):
        weights = pieces(placement, weight_shape, world, rank)
        scales = pieces(placement, scale_shape, world, rank)
        for w, s in zip(weights, scales, strict=True):
            want = covering_blocks(w.region, block)
            if (w.region.numel == 0) != (s.region.numel == 0) or (
                    w.region.numel and want != s.region):
                return (f"rank {rank} of {world} holds rows/cols {list(w.region.starts)}–"
                        f"{list(w.region.stops)} of the FP8 weight {list(weight_shape)}, "
                        f"which need scale tiles {list(want.starts)}–{list(want.stops)}, "
                        f"but the scale grid {list(scale_shape)} split the same way gives "
                        f"it {list(s.region.starts)}–{list(s.region.stops)}: a shard "
                        f"boundary falls inside a {block[0]}×{block[1]} block")
    return None


@cache
def _shard_math() -> ModuleType:
    """``shard_math``, imported by the first sharded FP8 weight checked (once, not per weight)."""
    from weightplan.planner.core.sharding import shard_math

    return shard_math


def scale_region(weight_shape: tuple[int, ...], scale_shape: tuple[int, ...], region: Region,
                 block: tuple[int, ...]) -> Region:
    """The part of a scale tensor a dequantize of ``region`` reads: its covering tiles
    when the scale is the weight's ceil grid, else (per-tensor scales) all of it."""
    grid = (*weight_shape[:-2], -(-weight_shape[-2] // block[0]), -(-weight_shape[-1] // block[1]))
    if len(weight_shape) < 2 or tuple(scale_shape) != grid or region.numel == 0:
        return Region.full(tuple(scale_shape))
    return covering_blocks(region, (block[0], block[1]))


def tile_frame(region: Region, tiles: Region, block: tuple[int, ...]
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(origin, full_shape)`` that make the covering ``tiles`` of ``region`` look like a
    whole scale grid: the box starts ``region.starts[-2:] % block`` into a weight of
    ``full_shape``, whose ceil grid is exactly ``tiles.shape`` (leading dims start at 0)."""
    *lead, rows, cols = region.shape
    dr = region.starts[-2] - tiles.starts[-2] * block[0]
    dc = region.starts[-1] - tiles.starts[-1] * block[1]
    return (*(0,) * len(lead), dr, dc), (*lead, dr + rows, dc + cols)
