"""Build conversions: resolve ops, infer every shape and dtype, create the graph nodes.

Each routed :class:`~weightplan.planner.keys.routing.Group` becomes a :class:`Conversion`:
its nodes (reads, the op chain resolved against the model — Chunk sizes, RoPE head
sizes — with every intermediate's spec, casts, and one sink per output) and one
:class:`Target` per output with its status (load, unexpected, shape mismatch, tied
duplicate). The nodes *are* the conversion: its op chain and the specs of every stage
are read back from them (:func:`stages`). What the outputs must match is the model
(loading) or the recorded checkpoint specs (saving, :class:`OutputSpecs`); where they go
is the plan's :class:`SinkKind`. Op failures at plan time raise :class:`OpError` naming
the converter, the keys and the op chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain
from functools import cache
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from weightplan.errors import ConflictingTransformError, OpError, ParallelError, WeightplanError
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.keys.routing import Group
from weightplan.planner.tensors.ir.nodes import (
    CastAttrs, Node, NodeKind, OpAttrs, SinkAttrs, op_attrs, read_streams, sink_attrs,
)
from weightplan.planner.core.ops.base import (
    ConversionOp, OpContext, Streams, Wiring, stream_positions,
)
from weightplan.planner.tensors.ir.stages import read_stages, stage_specs
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.ir.destination import (  # (their importers' names, kept here)
    Expected, OutputSpecs, SinkKind, Target, TargetStatus, destination, destination_dtype,
    expected_spec, make_target,
)

__all__ = ["Conversion", "Expected", "OutputSpecs", "SinkKind", "Target", "TargetStatus",
           "build_conversion", "build_conversions", "destination", "destination_dtype",
           "settle_claims", "shard_conversion", "stages"]

if TYPE_CHECKING:
    from weightplan.planner.tensors.ir.quant_build import QuantContext
    from weightplan.planner.tensors.ir.shard_nodes import Sharding


_SPEC, _KEY = attrgetter("spec"), attrgetter("key")


@dataclass(frozen=True, slots=True)
class Conversion:
    """A routed group with its targets and its graph nodes (reads … sinks)."""

    group: Group
    targets: tuple[Target, ...]
    nodes: tuple[Node, ...]  # topological order

    @property
    def loads(self) -> bool:
        return _LOAD in map(_STATUS, self.targets)

    @property
    def in_graph(self) -> bool:
        """Drawn and verified: something loads, or a mismatch shows where it would."""
        return not _DRAWN.isdisjoint(map(_STATUS, self.targets))

    @property
    def ops(self) -> tuple[ConversionOp, ...]:
        """The resolved op chain, read back from the op nodes."""
        by_stage: dict[int, ConversionOp] = {}
        for n in self.nodes:
            if n.kind is NodeKind.OP:
                by_stage.setdefault(op_attrs(n).stage, op_attrs(n).op)
        return tuple(by_stage[k] for k in sorted(by_stage))

    @property
    def sinks(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.kind is NodeKind.SINK)

    @property
    def quantizes(self) -> bool:
        return any(n.kind is NodeKind.QUANTIZE for n in self.nodes)

    @property
    def label(self) -> str:
        return self.targets[0].key if self.targets else self.group.targets[0]


_LOAD, _STATUS = TargetStatus.LOAD, attrgetter("status")
_DRAWN = frozenset((_LOAD, TargetStatus.MISMATCH))


def stages(conv: Conversion, kinds: list[NodeKind] | None = None
           ) -> tuple[Streams[Node], ...]:
    """Stage 0: the reads by source position, a dequantize in place of its weight's read;
    stage k: the outputs of op k-1 (see :func:`~weightplan.planner.tensors.ir.stages.read_stages`;
    ``kinds``: the nodes' kinds, when the caller has them)."""
    return read_stages(conv.nodes, tuple(map(len, conv.group.sources)), conv.label, kinds)


def build_conversions(groups: Sequence[Group], expected: Expected, dtype: torch.dtype | None,
                      sink: SinkKind, quant: QuantContext | None = None,
                      sharding: Sharding | None = None) -> tuple[Conversion, ...]:
    """Build every group, then settle tied duplicates and double claims. The conversions
    are every rank's: under ``sharding``, :func:`shard_conversion` keeps a rank's part."""
    return settle_claims([build_conversion(g, expected, dtype, sink, quant, sharding)
                          for g in groups])


def shard_conversion(conv: Conversion, sharding: Sharding) -> Conversion:
    """``conv`` as ``sharding``'s rank keeps it: each loaded target's sink takes this rank's
    part (:func:`~weightplan.planner.tensors.ir.shard_nodes.shard_sinks`). The rest of the
    graph is every rank's, so ranks planned together build it once (``conv`` itself
    when nothing changes)."""
    loads = {t.key for t in conv.targets if t.status is TargetStatus.LOAD}
    nodes = _shard_nodes().shard_sinks(conv.nodes, loads, sharding) if loads else conv.nodes
    return conv if nodes is conv.nodes else replace(conv, nodes=nodes)


def build_conversion(group: Group, expected: Expected, dtype: torch.dtype | None,
                     sink: SinkKind, quant: QuantContext | None = None,
                     sharding: Sharding | None = None) -> Conversion:
    """One group's conversion, every rank's (``sharding`` only refuses quantizing
    under it; :func:`shard_conversion` keeps a rank's part)."""
    quant_build, packed_build = _quantized_phases() if quant is not None else (None, None)
    if quant_build is None or packed_build is None:
        values, nodes = read_streams(group.sources)
    else:  # FP8 / packed weights behind their dequantize nodes, the rest plain reads
        values, nodes = (packed_build.packed_source_streams(group, quant, expected, dtype)
                         or quant_build.source_streams(group, quant, expected, dtype))
    ops = group.ops
    ctx = _context(group, expected, dtype) if ops else None
    for k, op in enumerate(ops):
        assert ctx is not None
        resolved, out_specs, wiring = _apply_op(op, ctx, stage_specs(values), group, k)
        values = _op_nodes(resolved, k, out_specs, wiring, values)
        nodes += chain.from_iterable(values)
    targets = list(_targets(group, stage_specs(values), expected, dtype))
    for t in tuple(targets):
        value = values[t.position[0]][t.position[1]]
        quantized = None if quant_build is None or t.status is not TargetStatus.LOAD \
            else quant_build.quantize_nodes(t.key, value, quant)
        if quantized is not None:
            if sharding is not None:
                raise ParallelError(f"{t.key}: quantizing a floating checkpoint to FP8 while "
                                    "sharding it is not supported; load it unsharded, or shard "
                                    "an FP8 checkpoint (kept or dequantized)")
            scale_target = _quantized_target(t, quantized, expected)
            t = replace(t, dtype=quantized[0].spec.dtype)
            targets[targets.index(next(x for x in targets if x.key == t.key))] = t
            targets.append(scale_target)
            nodes += [quantized[0], quantized[1],
                      Node(NodeKind.SINK, quantized[0].spec, (quantized[0],), SinkAttrs(destination(t, sink))),
                      Node(NodeKind.SINK, quantized[1].spec, (quantized[1],),
                           SinkAttrs(destination(scale_target, sink)))]
            continue
        fed = _fed(values, t.position)  # (the stream itself when it is the one value)
        if t.status is TargetStatus.LOAD and t.dtype != t.produced.dtype:
            value = Node(NodeKind.CAST, t.dest, fed, CastAttrs(t.dtype))
            nodes.append(value)
            fed = (value,)
        nodes.append(Node(NodeKind.SINK, value.spec, fed, SinkAttrs(destination(t, sink))))
    return Conversion(group, tuple(targets), tuple(nodes))


def _fed(values: Streams[Node], position: tuple[int, int]) -> tuple[Node, ...]:
    """The inputs of the node fed the value at ``position``: its stream as it is when that
    value is all of it (a plain key's read: no tuple made for it), else a new one."""
    stream = values[position[0]]
    return stream if len(stream) == 1 else (stream[position[1]],)


@cache
def _quantized_phases() -> tuple[ModuleType, ModuleType]:
    """Imported by the first quantized build (once: an import per group costs more)."""
    from weightplan.planner.tensors.ir import packed_build, quant_build

    return quant_build, packed_build


@cache
def _shard_nodes() -> ModuleType:
    """``shard_nodes``, imported by the first build under tensor parallelism."""
    from weightplan.planner.tensors.ir import shard_nodes

    return shard_nodes


def _quantized_target(t: Target, quantized: tuple[Node, Node, str], expected: Expected) -> Target:
    """The scale parameter a quantize node writes, as a target of its own."""
    _, scale, key = quantized
    mt = expected.get(key) if isinstance(expected, ModelInfo) else None
    want = expected_spec(expected, key)
    status = TargetStatus.LOAD if want is None or want.shape == scale.spec.shape else TargetStatus.MISMATCH
    return Target(key, scale.spec, t.position, mt, want, scale.spec.dtype, status)


def _op_nodes(op: ConversionOp, k: int, out_specs: Streams[TensorSpec], wiring: Wiring,
              inputs: Streams[Node]) -> Streams[Node]:
    return tuple(tuple(Node(NodeKind.OP, spec, _wired(inputs, wiring[i][j]),
                            OpAttrs(op, k, (i, j))) for j, spec in enumerate(stream))
                 for i, stream in enumerate(out_specs))


def _wired(inputs: Streams[Node], wires: tuple[tuple[int, int], ...]) -> tuple[Node, ...]:
    """The inputs ``wires`` names, in order: a whole stream (a merge of 256 experts) as it
    is when the wires are that stream's shared positions."""
    if wires and wires is stream_positions(wires[0][0], len(inputs[wires[0][0]])):
        return inputs[wires[0][0]]
    return tuple(inputs[a][b] for a, b in wires)


def _context(group: Group, expected: Expected, dtype: torch.dtype | None) -> OpContext:
    names = group.targets if group.explicit is None else tuple(s[0] for s in group.explicit)
    specs = tuple(expected_spec(expected, t) for t in names)
    keys = tuple(tuple(map(_KEY, s)) for s in group.sources)
    config = expected.config if isinstance(expected, ModelInfo) else None

    def written(i: int) -> torch.dtype | None:  # (what destination_dtype gives a float)
        mt = expected.get(names[i]) if isinstance(expected, ModelInfo) else None
        return None if mt is None and dtype is None else destination_dtype(_FLOAT, mt, dtype)

    return OpContext(group.targets, specs, keys, config, written)


_FLOAT = TensorSpec((), torch.float32)


def _apply_op(op: ConversionOp, ctx: OpContext, inputs: Streams[TensorSpec], group: Group,
              k: int) -> tuple[ConversionOp, Streams[TensorSpec], Wiring]:
    try:
        resolved = op.resolve(ctx, inputs)
        out = resolved.infer(inputs)
        return resolved, out, resolved.wiring(inputs)
    except Exception as e:  # torch raises RuntimeError on meta shape errors
        if isinstance(e, WeightplanError) and not isinstance(e, OpError):
            raise
        chain = " → ".join(repr(o) for o in group.ops)
        shapes = [[list(s.shape) for s in stream] for stream in inputs]
        first = group.sources[0][0]
        raise OpError(f"{_describe(group)}: op #{k} {op!r} failed for target "
                      f"{group.targets[0]} on input shapes {shapes} (from {first.key} and "
                      f"{len(group.entries) - 1} more keys in {first.file or '<memory>'}); "
                      f"op chain: {chain}: {e}") from e


def _describe(group: Group) -> str:
    return group.converter.describe() if group.converter is not None else group.targets[0]


def _targets(group: Group, outputs: Streams[TensorSpec], expected: Expected,
             dtype: torch.dtype | None) -> tuple[Target, ...]:
    if len(outputs) != len(group.targets):
        raise OpError(f"{_describe(group)}: the ops yield {len(outputs)} output "
                      f"stream(s) but the converter has {len(group.targets)} target(s) "
                      f"({', '.join(group.targets)})")
    if len(outputs) == 1 and len(outputs[0]) == 1 and \
            (group.explicit is None or len(group.explicit[0]) == 1):  # (one output, as recorded)
        return (make_target(group.output_key(0, 0), outputs[0][0], _ONE, expected, dtype),)
    out = []
    for i, (pattern, stream) in enumerate(zip(group.targets, outputs, strict=True)):
        count = len(group.explicit[i]) if group.explicit is not None else None
        if count is None and len(stream) > 1 and "*" not in pattern:
            raise OpError(f"{_describe(group)}: output {i} is a list of "
                          f"{len(stream)} tensors but target {pattern!r} has no `*` for them")
        if count is not None and count != len(stream):
            raise OpError(f"output {i} of {_describe(group)} has {len(stream)} "
                          f"tensors where {count} were recorded")
        positions = stream_positions(i, len(stream))  # (shared by every conversion)
        for j, spec in enumerate(stream):
            out.append(make_target(group.output_key(i, j), spec, positions[j], expected, dtype))
    return tuple(out)


_ONE = stream_positions(0, 1)[0]  # (the position of a lone output)


def settle_claims(conversions: list[Conversion]) -> tuple[Conversion, ...]:
    """One producer per model tensor: tied aliases load once, double claims are errors."""
    claims: dict[str, tuple[int, Target]] = {}
    for ci, conv in enumerate(conversions):
        for t in conv.targets:
            if t.model is None or t.status is TargetStatus.UNEXPECTED:
                continue
            prior = claims.get(t.model.name)
            if prior is None:
                claims[t.model.name] = (ci, t)
            elif prior[1].key == t.key:
                first = ", ".join(e.key for e in conversions[prior[0]].group.entries)
                raise ConflictingTransformError(f"two checkpoint sources map to {t.key}: {first} "
                                                f"and {', '.join(e.key for e in conv.group.entries)}")
            elif t.key == t.model.name:  # the canonical name wins over an alias
                claims[t.model.name] = (ci, t)
    winners = {(ci, t.key) for ci, t in claims.values()}
    return tuple(_settled(ci, conv, winners) for ci, conv in enumerate(conversions))


def _settled(ci: int, conv: Conversion, winners: set[tuple[int, str]]) -> Conversion:
    tied = {t.key for t in conv.targets if t.model is not None
            and t.status is not TargetStatus.UNEXPECTED and (ci, t.key) not in winners}
    if not tied:
        return conv
    targets = tuple(replace(t, status=TargetStatus.TIED_DUPLICATE) if t.key in tied else t
                    for t in conv.targets)
    nodes = []
    for n in conv.nodes:
        if n.kind is NodeKind.SINK and sink_attrs(n).target in tied:
            value = n.inputs[0]
            while value.kind in (NodeKind.CAST, NodeKind.SHARD):
                value = value.inputs[0]
            t = next(t for t in targets if t.key == sink_attrs(n).target)
            n = Node(NodeKind.SINK, value.spec, (value,), SinkAttrs(destination(t, SinkKind.MODEL)))
        nodes.append(n)
    return replace(conv, targets=targets, nodes=_live(tuple(nodes)))


def _live(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """Drop nodes no sink depends on any more (a cast for a tied duplicate)."""
    keep: set[Node] = set()
    stack = [n for n in nodes if n.kind is NodeKind.SINK]
    while stack:
        n = stack.pop()
        if n not in keep:
            keep.add(n)
            stack.extend(n.inputs)
    return tuple(n for n in nodes if n in keep)
