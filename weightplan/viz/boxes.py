"""What one drawn node says: a folded slot of a conversion's graph, as label lines.

A *slot* is the set of graph nodes that the grouped picture draws as one box: every
read of one source stream (``experts.{0..7}.w1.weight``), every output of one op stage
and stream, the cast and the assign of one target stream. In full detail every node is
its own slot. Boxes show keys (folded over all the conversions they stand for), the op,
shape, dtype and bytes (of one instance).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.destination import DestKind
from weightplan.planner.tensors.ir.nodes import (
    DequantizeAttrs, Node, NodeKind, OpAttrs, QuantizeAttrs, ReadAttrs, ShardAttrs, SinkAttrs,
    cast_attrs, op_attrs, read_attrs, sink_attrs,
)
from weightplan.planner.core.spec import short_dtype
from weightplan.units import format_bytes
from weightplan.viz.folding import fold_keys, ranges, split_numbers
from weightplan.viz.rows import quant_label
from weightplan.viz.style import KIND_COLOURS, PROBLEM_FILL, op_colour

MAX_KEY_LINES = 3

Slot = tuple[int, ...]


@dataclass(frozen=True)
class Box:
    """One drawn node: its kind, label lines, fill colour and marks."""

    kind: NodeKind
    lines: tuple[str, ...]
    fill: str
    peak: bool = False
    problem: bool = False


@dataclass(frozen=True)
class BoxContext:
    """What a box needs beyond its nodes: the conversion drawn and the plan's peak."""

    conv: Conversion
    materialized: int  # leading ops that run on tensors (the rest are placed in memory)
    peak_line: str | None  # set on the part holding the peak step
    count_note: str  # "×240" when the part stands for more conversions than its cluster
    ties: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # target → its other names


def node_slots(conv: Conversion, grouped: bool) -> dict[Node, Slot]:
    """The slot of every node of ``conv`` (see the module docstring)."""
    if not grouped:
        return {n: (i,) for i, n in enumerate(conv.nodes)}
    streams = {e.key: i for i, s in enumerate(conv.group.sources) for e in s}  # a key: one entry
    target_stream = {t.key: t.position[0] for t in conv.targets}
    last = len(conv.ops)
    slots: dict[Node, Slot] = {}
    for n in conv.nodes:
        a = n.attrs
        if isinstance(a, ReadAttrs) and a.entry.key in streams:
            slots[n] = (0, streams[a.entry.key])
        elif isinstance(a, DequantizeAttrs):  # an FP8 read, its scale's read, the dequantize
            stream = streams[read_attrs(n.inputs[0]).entry.key]
            slots[n.inputs[1]], slots[n] = (0, stream, 1), (0, stream, 2)
        elif isinstance(a, OpAttrs):
            slots[n] = (1 + a.stage, a.position[0])
        elif isinstance(a, SinkAttrs):
            stream = target_stream[a.target]
            value = n.inputs[0] if n.inputs else None
            scale = value is not None and isinstance(value.attrs, QuantizeAttrs) and value.attrs.scale
            slots[n] = (last + 2, stream, 1) if scale else (last + 2, stream)
            if value is not None and value.kind is NodeKind.SHARD:  # this rank's part
                slots[value] = (last + 2, stream, 0)
                value = value.inputs[0]
            if value is not None and value.kind in (NodeKind.CAST, NodeKind.QUANTIZE):
                slots[value] = (last + 1, stream, 1) if scale else (last + 1, stream)
    return slots


def make_box(kind: NodeKind, rep: Sequence[Node], every: Sequence[Node], ctx: BoxContext) -> Box:
    """The box for one slot: ``rep`` are its nodes in the drawn conversion, ``every`` its
    nodes across all the conversions the part stands for."""
    size = f"{_specs(rep)} · {format_bytes(sum(n.spec.nbytes for n in rep))}"
    if kind is NodeKind.READ:
        keys = _keys([read_attrs(n).entry.key for n in every])
        what = f"read {_index_range(rep)}: " if len(rep) > 1 else "read "
        return Box(kind, (*keys, what + size), KIND_COLOURS[kind])
    if kind is NodeKind.OP:
        op = op_attrs(rep[0]).op
        how = "materialized" if op_attrs(rep[0]).stage < ctx.materialized else "in place"
        times = f" ×{len(rep)}" if len(rep) > 1 else ""
        return Box(kind, (f"{op!r}{times}", f"{size} · {how}"), op_colour(type(op).__name__))
    if kind is NodeKind.CAST:
        return Box(kind, (f"cast → {short_dtype(cast_attrs(rep[0]).dtype)}", size), KIND_COLOURS[kind])
    if kind in (NodeKind.DEQUANTIZE, NodeKind.QUANTIZE):
        return Box(kind, (quant_label(rep[0]), size), KIND_COLOURS[kind])
    if kind is NodeKind.SHARD:
        a = rep[0].attrs
        assert isinstance(a, ShardAttrs)
        return Box(kind, (f"shard {a.placement} · rank {a.rank}/{a.world_size}", size),
                   KIND_COLOURS[kind])
    return _assign_box(rep, every, size, ctx)


def _assign_box(rep: Sequence[Node], every: Sequence[Node], size: str, ctx: BoxContext) -> Box:
    keys = _keys([sink_attrs(n).target for n in every])
    names = {sink_attrs(n).target for n in rep}
    mismatched = [t for t in ctx.conv.targets
                  if t.key in names and t.status is TargetStatus.MISMATCH]
    how = "not loaded" if mismatched else {  # (a mismatch is refused: nothing is written)
        DestKind.ALLOCATE: "allocates", DestKind.IN_PLACE: "in place", DestKind.FILE: "to file",
        DestKind.MEMORY: "allocates", DestKind.DISCARD: "dropped"}[sink_attrs(rep[0]).dest.kind]
    lines = [*keys, f"assign {size} · {how}{ctx.count_note}"]
    for t in mismatched[:1]:
        lines.append(f"mismatch: the model has {t.expected}")
    tied = [name for n in every for name in ctx.ties.get(sink_attrs(n).target, ())]
    if tied:  # (one tensor under several names: loaded once)
        lines.append(f"tied: {', '.join(_keys(tied))} (one tensor)")
    if ctx.peak_line:
        lines.append(ctx.peak_line)
    fill = PROBLEM_FILL if mismatched else KIND_COLOURS[NodeKind.SINK]
    return Box(NodeKind.SINK, tuple(lines), fill, peak=ctx.peak_line is not None,
               problem=bool(mismatched))


def _keys(keys: list[str]) -> tuple[str, ...]:
    folded = fold_keys(keys)
    if len(folded) > MAX_KEY_LINES:
        more = len(folded) - MAX_KEY_LINES + 1
        folded = folded[:MAX_KEY_LINES - 1] + [f"… {more} more key patterns"]
    return tuple(folded)


def _specs(nodes: Sequence[Node]) -> str:
    """``f32[8, 64]``, or ``8 × f32[128, 64]`` for a folded stream of equal specs."""
    distinct = list(dict.fromkeys(str(n.spec) for n in nodes))
    if len(nodes) == 1:
        return distinct[0]
    if len(distinct) == 1:
        return f"{len(nodes)} × {distinct[0]}"
    return f"{len(nodes)} tensors ({', '.join(distinct[:2])}{', …' if len(distinct) > 2 else ''})"


def _index_range(reads: Sequence[Node]) -> str:
    """``experts 0..7``: the key component that varies along a read stream, and its range."""
    split = [split_numbers(read_attrs(n).entry.key) for n in reads]
    template, numbers = split[0][0], [nums for _, nums in split]
    varying = [p for p in range(len(numbers[0])) if len({nums[p] for nums in numbers}) > 1]
    if not varying or any(s[0] != template for s in split):
        return f"{len(reads)} tensors"
    p = varying[0]
    where = [i for i, part in enumerate(template) if part is None][p]
    name = template[where - 1] if where > 0 and template[where - 1] is not None else "index"
    return f"{name} {ranges(nums[p] for nums in numbers).strip('{}')}"
