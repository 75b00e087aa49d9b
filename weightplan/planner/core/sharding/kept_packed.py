"""Keep-quantized under tensor parallel: each stored part's placement, from its weight's.

A model that holds a packed weight's stored tensors (keep-quantized: ``q_proj.weight_packed``,
``.weight_scale``, ``.weight_zero_point``, ``.weight_global_scale``, MXFP4's ``_blocks`` /
``_scales``) is sharded by the style of the weight's module, applied to the *logical*
weight (``[..., out, in]``, or gpt-oss's ``[..., in, out]``): a column-parallel module splits
``out``, a row-parallel one ``in``, expert parallel the leading dim. Each part then takes
the slice of itself that the rank's slice of the logical weight needs
(:func:`~weightplan.planner.core.quant.packed_slices.packed_cover`: the packed words or
bytes of those elements, the scale rows / groups / blocks over them, the zero-point words),
which must be exactly what DTensor's even chunks of that part give the rank:

- a part whose box is the whole part on every rank (a per-tensor or global scale, a
  per-channel scale under a row split, ``weight_shape``) is replicated;
- a part whose box moves along one dim is sharded on that dim (same kind and split
  factor as the weight's placement);
- anything else can't be held exactly and is refused (:class:`ParallelError` at plan
  time, naming the tensor and the boundary): a rank's slice that cuts a quantization group
  (MXFP4 32, NVFP4 16, int ``group_size``), an FP8 block, or a packed word (int4: 8 values
  per int32; asymmetric zero points: 8 rows per word), or an act-order weight split along
  ``in`` (its groups are ``g_idx``'s, scattered over the columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from weightplan.planner.core.geometry import Region
from weightplan.planner.core.quant.formats import Scheme
from weightplan.planner.core.quant.packed_slices import packed_cover
from weightplan.planner.core.sharding.placements import Placement, PlacementKind
from weightplan.planner.core.sharding.shard_math import pieces


@dataclass(frozen=True, slots=True)
class KeptParts:
    """A kept weight's parts placed: one placement per part (``scheme.roles`` order),
    or ``problem`` (why the weight can't be held sharded exactly)."""

    placements: tuple[Placement, ...]
    problem: str | None = None


def kept_part_placements(scheme: Scheme, shape: tuple[int, ...],
                         part_shapes: tuple[tuple[int, ...], ...], logical: Placement,
                         world: int, names: tuple[str, ...]) -> KeptParts:
    """Each part's placement for a logical weight of ``shape`` placed ``logical`` over
    ``world`` ranks (``names``: the parts' names, for the problem's text)."""
    p = logical.normalized(len(shape))
    if not p.is_sharded:
        return KeptParts(tuple(p for _ in part_shapes))
    boxes: list[list[list[Region | None]]] = []  # rank → piece → part boxes
    for rank in range(world):
        per_piece = []
        for piece in pieces(p, shape, world, rank):
            region = piece.region
            cover = packed_cover(scheme, shape, region)
            why = None if region.numel == 0 else _widened(scheme, shape, region, cover.box,
                                                          cover.split)
            if why is not None:
                return KeptParts((), f"rank {rank} of {world}: {why}")
            per_piece.append(list(cover.parts))
        boxes.append(per_piece)
    out = []
    for i, (part_shape, name) in enumerate(zip(part_shapes, names, strict=True)):
        placement = _part_placement(p, part_shape, [[b[i] for b in r] for r in boxes], world)
        if placement is None:
            return KeptParts((), f"its {name} {list(part_shape)} can't be split by DTensor's "
                             f"even chunks into the slices each rank's part of the weight needs")
        out.append(placement)
    return KeptParts(tuple(out))


def _widened(scheme: Scheme, shape: tuple[int, ...], region: Region, box: Region,
             split: tuple[int, int] | None) -> str | None:
    """Why the rank's ``region`` is not a whole number of the format's units (``None``:
    it is)."""
    if split is not None:
        group, at = split
        return (f"the shard boundary at element {at} of `in` cuts a quantization group of "
                f"{group}: a quantized part can't hold part of a group")
    if box == region:
        return None
    if scheme.act_order:
        return ("an act-order weight (weight_g_idx) can't be split along `in`: its groups "
                "are scattered over the columns")
    d = next(i for i in range(len(shape)) if (box.starts[i], box.stops[i])
             != (region.starts[i], region.stops[i]))
    return (f"its slice [{region.starts[d]}, {region.stops[d]}) of dim {d} ({shape[d]}) is "
            f"not whole {_unit(scheme, shape, d)}: it widens to [{box.starts[d]}, "
            f"{box.stops[d]})")


def _unit(scheme: Scheme, shape: tuple[int, ...], d: int) -> str:
    out_dim = len(shape) - (1 if scheme.transpose else 2)
    if scheme.format == "int":
        if d == out_dim:
            return f"zero-point words ({32 // scheme.bits} rows per int32)"
        return f"packed words ({32 // scheme.bits} values per int32)"
    if scheme.format == "fp8" and scheme.strategy == "block":
        return f"FP8 scale blocks {scheme.block}"
    return "quantization units"


def _part_placement(logical: Placement, part_shape: tuple[int, ...],
                    boxes: list[list[Region | None]], world: int) -> Placement | None:
    """The placement that gives each rank its part boxes (``boxes[rank][piece]``), or
    ``None`` when none does."""
    full = Region.full(part_shape)
    moving = {d for per in boxes for b in per if b is not None and b.numel
              for d in range(len(part_shape)) if (b.starts[d], b.stops[d]) != (0, part_shape[d])}
    empty = any(b is not None and b.numel == 0 for per in boxes for b in per)
    if not moving and not empty:  # (the whole part on every rank)
        return Placement.replicate()
    if len(moving) > 1:
        return None
    if not moving:  # (every non-empty rank holds it whole, some hold nothing)
        return None
    d = moving.pop()
    candidate = Placement.shard(d) if logical.kind is PlacementKind.SHARD \
        else Placement.strided(d, logical.split_factor)
    for rank, per in enumerate(boxes):
        want = [b if b is not None else full for b in per]
        got = [pc.region for pc in pieces(candidate, part_shape, world, rank)]
        if len(got) != len(want) or not all(_same(a, b) for a, b in zip(got, want, strict=True)):
            return None
    return candidate


def _same(a: Region, b: Region) -> bool:
    return a == b or (a.numel == 0 and b.numel == 0)
