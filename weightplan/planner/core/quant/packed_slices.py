"""Packed formats under sharding: which stored bytes a slice of the logical weight needs.

A rank's slice of a packed weight (a box of the logical tensor: rows of a column-parallel
``gate_proj``, columns of a row-parallel ``down_proj``, some experts of a stack) is
decoded from the box of each stored part that covers it. The slice is first widened to
the quantization grid (:func:`packed_cover`): along ``in`` to whole groups (MXFP4 32,
NVFP4 16, int ``group_size``, FP8 group / block columns; int per channel to whole packed
words), along ``out`` to whole zero-point words (asymmetric int) or block rows (FP8
block). Every part's box follows from that widened box, and the parts cut to it are a
small packed weight of their own (the widened box's shape), which the formats' decoders
take as they are; the rank's slice is then the region inside it.

A slice whose ``in`` range starts or stops inside a group (MXFP4, NVFP4, int group
strategy) is exact this way too, but two ranks would each read and decode the same
group: :attr:`PackedCover.split` names the group size and the boundary, and the plan
reports it (a shard boundary inside a quantization group).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from weightplan.planner.core.geometry import CACHE_SIZE, Region
from weightplan.planner.core.quant.formats import Scheme, natural


@dataclass(frozen=True, slots=True)
class PackedCover:
    """What a slice of a packed weight reads.

    ``box``: the widened slice, in the logical tensor's coordinates (the local weight's
    extent); ``parts``: each stored part's box, in ``scheme.roles`` order (``None``: the
    part is read whole, a per-tensor scale or a global one); ``split``: ``(group,
    boundary)`` when the slice's ``in`` range cuts a quantization group (else ``None``).
    """

    box: Region
    parts: tuple[Region | None, ...]
    split: tuple[int, int] | None

    def local(self, region: Region) -> Region:
        """``region`` (inside ``box``) relative to the box's first element."""
        return Region(tuple(a - b for a, b in zip(region.starts, self.box.starts, strict=True)),
                      tuple(a - b for a, b in zip(region.stops, self.box.starts, strict=True)))


def groups_along_in(scheme: Scheme) -> int | None:
    """The elements of ``in`` that share a scale and must stay on one rank (``None``:
    the format has no such groups: FP8, int per channel / tensor)."""
    if scheme.format == "mxfp4":
        return 32
    if scheme.format == "nvfp4":
        return 16
    if scheme.format == "int" and scheme.strategy == "group":
        return scheme.group
    return None


@lru_cache(maxsize=CACHE_SIZE)
def packed_cover(scheme: Scheme, shape: tuple[int, ...], region: Region) -> PackedCover:
    """The :class:`PackedCover` of ``region`` of a packed weight of logical ``shape``."""
    t = scheme.transpose
    (o0, i0), (o1, i1) = _natural2(region.starts, t), _natural2(region.stops, t)
    out, n = natural(scheme, shape)[-2:]
    row, col = _units(scheme, n)
    r0, r1 = o0 // row * row, min(out, -(-o1 // row) * row)
    c0, c1 = i0 // col * col, min(n, -(-i1 // col) * col)
    if scheme.act_order:  # (a column's group is g_idx's: every column, every group read)
        c0, c1 = 0, n
    lead = (region.starts[:-2], region.stops[:-2])
    ends = ((c0, r0), (c1, r1)) if t else ((r0, c0), (r1, c1))
    box = Region(lead[0] + ends[0], lead[1] + ends[1])
    group = groups_along_in(scheme)
    split = None
    if group and i0 % group:
        split = (group, i0)
    elif group and i1 % group and i1 != n:
        split = (group, i1)
    return PackedCover(box, _part_boxes(scheme, lead, (r0, r1), (c0, c1)), split)


def _natural2(index: tuple[int, ...], transpose: bool) -> tuple[int, int]:
    """``(out, in)`` of a logical index's last two entries."""
    return (index[-1], index[-2]) if transpose else (index[-2], index[-1])


def _units(scheme: Scheme, n: int) -> tuple[int, int]:
    """``(rows, cols)``: the grid a slice is widened to (rows of ``out``, cols of ``in``)."""
    if scheme.format == "mxfp4":
        return 1, 32
    if scheme.format == "nvfp4":
        return 1, 16
    if scheme.format == "int":
        per_word = 32 // scheme.bits
        rows = 1 if scheme.symmetric else per_word
        if scheme.strategy == "group" and scheme.group and scheme.group * scheme.bits % 32 == 0:
            return rows, scheme.group
        return rows, per_word if scheme.strategy != "group" else max(1, n)
    if scheme.strategy == "block":
        b0, b1 = scheme.block or (128, 128)
        return b0, b1
    if scheme.strategy == "group":
        return 1, scheme.group or max(1, n)
    return 1, 1


def _part_boxes(scheme: Scheme, lead: tuple[tuple[int, ...], tuple[int, ...]],
                rows: tuple[int, int], cols: tuple[int, int]) -> tuple[Region | None, ...]:
    """Each stored part's box for the widened ``rows`` × ``cols`` of ``out`` × ``in``."""
    (r0, r1), (c0, c1) = rows, cols

    def box(*dims: tuple[int, int]) -> Region:
        return Region(lead[0] + tuple(a for a, _ in dims), lead[1] + tuple(b for _, b in dims))

    if scheme.format == "mxfp4":
        g = (c0 // 32, c1 // 32)
        return box(rows, g, (0, 16)), box(rows, g)
    if scheme.format == "nvfp4":
        return box(rows, (c0 // 2, c1 // 2)), box(rows, (c0 // 16, -(-c1 // 16))), None
    first = box(rows, (c0 * scheme.bits // 32, -(-c1 * scheme.bits // 32))) \
        if scheme.format == "int" else box(rows, cols)
    scale = _scale_box(scheme, box, rows, cols)
    g_idx = (None,) if scheme.act_order else ()  # (read whole: every column's group)
    if scheme.format == "int" and not scheme.symmetric:
        assert scale is not None
        zero_rows = (r0 * scheme.bits // 32, -(-r1 * scheme.bits // 32))
        return first, scale, box(zero_rows, (scale.starts[-1], scale.stops[-1])), *g_idx
    return first, scale, *g_idx


def _scale_box(scheme: Scheme, box: object, rows: tuple[int, int], cols: tuple[int, int]
               ) -> Region | None:
    """The scale's box by the strategy (``None``: one scale, read whole)."""
    make = box  # (the lead-prefixing builder of _part_boxes)
    (r0, r1), (c0, c1) = rows, cols
    if scheme.strategy == "tensor":
        return None
    if scheme.strategy == "channel":
        return make(rows, (0, 1))  # type: ignore[operator]
    if scheme.strategy == "block":
        b0, b1 = scheme.block or (128, 128)
        return make((r0 // b0, -(-r1 // b0)), (c0 // b1, -(-c1 // b1)))  # type: ignore[operator]
    g = scheme.group or max(1, c1)
    return make(rows, (c0 // g, -(-c1 // g)))  # type: ignore[operator]
