"""Build conversions: resolve ops, infer every shape and dtype, create the graph nodes.

Each routed :class:`~weightplan.planner.keys.routing.Group` becomes a :class:`Conversion`: its
op chain resolved against the model (Chunk sizes, RoPE head sizes), the spec of every
intermediate, and one :class:`Target` per output with its status (load, unexpected,
shape mismatch, tied duplicate). Op failures at plan time raise :class:`OpError` naming
the converter, the keys and the op chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

import torch

from weightplan.errors import ConflictingTransformError, OpError, WeightplanError
from weightplan.planner.keys.routing import Group
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor
from weightplan.planner.tensors.nodes import AssignAttrs, CastAttrs, Node, NodeKind, OpAttrs, ReadAttrs
from weightplan.planner.tensors.ops.base import ConversionOp, OpContext, Streams
from weightplan.planner.tensors.spec import TensorSpec


class TargetStatus(Enum):
    LOAD = "load"
    UNEXPECTED = "unexpected"  # no such model tensor
    MISMATCH = "mismatch"  # converted shape differs from the model's
    TIED_DUPLICATE = "tied"  # another name of the same tied tensor is loaded instead


@dataclass(frozen=True)
class Target:
    """One output of a conversion and what happens to it."""

    key: str
    produced: TensorSpec  # what the op chain yields
    position: tuple[int, int]  # (stream, index) in the final stage
    model: ModelTensor | None
    dtype: torch.dtype  # dtype written into the model
    status: TargetStatus

    @property
    def dest(self) -> TensorSpec:
        return TensorSpec(self.produced.shape, self.dtype)


@dataclass(frozen=True)
class Conversion:
    """A group with resolved ops, inferred specs, targets and graph nodes."""

    group: Group
    ops: tuple[ConversionOp, ...]
    stages: tuple[Streams[TensorSpec], ...]  # stage 0: sources; stage len(ops): outputs
    targets: tuple[Target, ...]
    nodes: tuple[Node, ...]

    @property
    def loads(self) -> bool:
        return any(t.status is TargetStatus.LOAD for t in self.targets)

    @property
    def label(self) -> str:
        return self.targets[0].key if self.targets else self.group.targets[0]


def build_conversions(groups: Sequence[Group], model: ModelInfo | None,
                      dtype: torch.dtype | None) -> tuple[Conversion, ...]:
    """Build every group, then settle tied duplicates and double claims."""
    built = [build_conversion(g, model, dtype) for g in groups]
    return settle_claims(built)


def build_conversion(group: Group, model: ModelInfo | None, dtype: torch.dtype | None
                     ) -> Conversion:
    stages: list[Streams[TensorSpec]] = [tuple(tuple(e.spec for e in s) for s in group.sources)]
    nodes: list[list[Node]] = [[Node(NodeKind.READ, e.spec, (), ReadAttrs(e)) for e in s]
                               for s in group.sources]
    all_nodes = [n for s in nodes for n in s]
    ops: list[ConversionOp] = []
    ctx = _context(group, model)
    for k, op in enumerate(group.converter.operations if group.converter else ()):
        resolved, out_specs, wiring = _apply_op(op, ctx, stages[-1], group, k)
        nodes = [[Node(NodeKind.OP, spec, tuple(nodes[a][b] for a, b in wiring[i][j]),
                       OpAttrs(resolved, k, (i, j))) for j, spec in enumerate(stream)]
                 for i, stream in enumerate(out_specs)]
        all_nodes += [n for s in nodes for n in s]
        ops.append(resolved)
        stages.append(out_specs)
    targets = _targets(group, stages[-1], model, dtype)
    for t in targets:
        if t.status is TargetStatus.UNEXPECTED:
            continue
        value = nodes[t.position[0]][t.position[1]]
        if t.dtype != t.produced.dtype:
            value = Node(NodeKind.CAST, t.dest, (value,), CastAttrs(t.dtype))
            all_nodes.append(value)
        aliases = t.model.aliases if t.model else (t.key,)
        all_nodes.append(Node(NodeKind.ASSIGN, t.dest, (value,),
                              AssignAttrs(t.key, aliases, bool(t.model and t.model.allocates))))
    return Conversion(group, tuple(ops), tuple(stages), targets, _prune(tuple(all_nodes)))


def _context(group: Group, model: ModelInfo | None) -> OpContext:
    names = group.targets if group.explicit is None else tuple(s[0] for s in group.explicit)
    specs = tuple(model.get(t).spec if model is not None and model.get(t) is not None else None
                  for t in names)
    keys = tuple(tuple(e.key for e in s) for s in group.sources)
    return OpContext(group.targets, specs, keys, model.config if model is not None else None)


def _apply_op(op: ConversionOp, ctx: OpContext, inputs: Streams[TensorSpec], group: Group,
              k: int):
    try:
        resolved = op.resolve(ctx, inputs)
        out = resolved.infer(inputs)
        return resolved, out, resolved.wiring(inputs)
    except Exception as e:  # torch raises RuntimeError on meta shape errors
        if isinstance(e, WeightplanError) and not isinstance(e, OpError):
            raise
        chain = " → ".join(repr(o) for o in group.converter.operations)
        shapes = [[list(s.shape) for s in stream] for stream in inputs]
        first = group.sources[0][0]
        raise OpError(f"{group.converter.describe()}: op #{k} {op!r} failed for target "
                      f"{group.targets[0]} on input shapes {shapes} (from {first.key} and "
                      f"{len(group.entries) - 1} more keys in {first.file or '<memory>'}); "
                      f"op chain: {chain}: {e}") from e


def _targets(group: Group, outputs: Streams[TensorSpec], model: ModelInfo | None,
             dtype: torch.dtype | None) -> tuple[Target, ...]:
    if len(outputs) != len(group.targets):
        raise OpError(f"{group.converter.describe()}: the ops yield {len(outputs)} output "
                      f"stream(s) but the converter has {len(group.targets)} target(s) "
                      f"({', '.join(group.targets)})")
    out = []
    for i, (pattern, stream) in enumerate(zip(group.targets, outputs)):
        expected = len(group.explicit[i]) if group.explicit is not None else None
        if expected is None and len(stream) > 1 and "*" not in pattern:
            raise OpError(f"{group.converter.describe()}: output {i} is a list of "
                          f"{len(stream)} tensors but target {pattern!r} has no `*` for them")
        if expected is not None and expected != len(stream):
            raise OpError(f"output {i} of {group.converter.describe()} has {len(stream)} "
                          f"tensors where {expected} were recorded")
        for j, spec in enumerate(stream):
            out.append(_target(group.output_key(i, j), spec, (i, j), model, dtype))
    return tuple(out)


def _target(key: str, spec: TensorSpec, position: tuple[int, int], model: ModelInfo | None,
            dtype: torch.dtype | None) -> Target:
    mt = model.get(key) if model is not None else None
    if model is not None and mt is None:
        return Target(key, spec, position, None, spec.dtype, TargetStatus.UNEXPECTED)
    status = TargetStatus.LOAD
    if mt is not None and tuple(mt.spec.shape) != tuple(spec.shape):
        status = TargetStatus.MISMATCH
    return Target(key, spec, position, mt, destination_dtype(spec, mt, dtype), status)


def destination_dtype(produced: TensorSpec, mt: ModelTensor | None,
                      requested: torch.dtype | None) -> torch.dtype:
    """Allocated tensors keep their dtype; new ones take ``requested`` (floats) or the model's."""
    floating = produced.dtype.is_floating_point
    if mt is None:
        return requested if requested is not None and floating else produced.dtype
    if not mt.on_meta or requested is None or mt.keep_dtype or not mt.spec.dtype.is_floating_point:
        return mt.spec.dtype
    return requested if floating else mt.spec.dtype


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
                raise ConflictingTransformError(
                    f"two checkpoint sources map to {t.key}: "
                    f"{_sources(conversions[prior[0]])} and {_sources(conv)}")
            elif t.key == t.model.name:  # the canonical name wins over an alias
                claims[t.model.name] = (ci, t)
    winners = {(ci, t.key) for ci, t in claims.values()}
    settled = []
    for ci, conv in enumerate(conversions):
        targets = tuple(
            replace(t, status=TargetStatus.TIED_DUPLICATE)
            if t.model is not None and t.status is not TargetStatus.UNEXPECTED
            and (ci, t.key) not in winners else t
            for t in conv.targets)
        if targets != conv.targets:
            nodes = tuple(n for n in conv.nodes if not (
                n.kind is NodeKind.ASSIGN and any(
                    t.key == n.attrs.target and t.status is TargetStatus.TIED_DUPLICATE
                    for t in targets)))
            conv = replace(conv, targets=targets, nodes=_prune(nodes))
        settled.append(conv)
    return tuple(settled)


def _prune(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """Drop nodes no assign depends on any more."""
    keep: set[Node] = set()
    stack = [n for n in nodes if n.kind is NodeKind.ASSIGN]
    while stack:
        n = stack.pop()
        if n not in keep:
            keep.add(n)
            stack.extend(n.inputs)
    return tuple(n for n in nodes if n in keep)


def _sources(conv: Conversion) -> str:
    return ", ".join(e.key for e in conv.group.entries)
