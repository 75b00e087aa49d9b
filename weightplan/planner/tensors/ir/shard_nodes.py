"""Shard nodes: one rank's part of a conversion output, between the value and its sink.

``build`` calls :func:`shard_target` for every loaded target of a tensor-parallel plan:
a sharded parameter gets a ``SHARD`` node (its pieces of the global value) and a
destination of the local shape that remembers where it sits in the whole
(:class:`DestShard`); a replicated ``DTensor`` parameter keeps the whole value and only
the destination's note; a plain one is untouched. Lowering starts from the sink:
:func:`shard_fragments` turns the shard's pieces into fragments (global region → view of
the local tensor), which the ops' ``place`` pushes down to the reads, so a rank reads only
its bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from operator import is_
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from weightplan.planner.tensors.ir.destination import Destination, DestKind
from weightplan.planner.core.geometry import CACHE_SIZE, Fragment, View, row_major_strides
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ShardAttrs, SinkAttrs, sink_attrs
from weightplan.planner.core.sharding.placements import DestShard, Placement, PlacementKind
from weightplan.planner.core.sharding.shard_math import pieces
from weightplan.planner.core.spec import TensorSpec

if TYPE_CHECKING:  # (resolving a tensor-parallel plan is imported where tp= asks for it)
    from weightplan.planner.inputs.packed_pairs import PackedWeight
    from weightplan.planner.inputs.parallel_plan import ShardingPlan


@dataclass(frozen=True)
class Sharding:
    """One rank's view of a resolved plan: what the builder and the sink need."""

    plan: ShardingPlan
    world_size: int
    rank: int
    output: str = "dtensor"
    mesh: Any = field(default=None, compare=False)
    cooperative: bool = False  # replicated tensors: read by one rank, broadcast to the rest
    local_world_size: int = 1  # ranks per node (numbered node by node)
    storage: str = "shared"  # "shared": one file system; "node": a copy on each node

    def placement(self, key: str, ndim: int) -> Placement:
        return self.plan.placement(key).normalized(ndim)


def shard_target(value: Node, dest: Destination, key: str, sharding: Sharding
                 ) -> tuple[Node, Destination]:
    """The value this rank keeps of ``key`` and its destination (unchanged when plain)."""
    shape = value.spec.shape
    p = sharding.placement(key, len(shape))
    if p.kind is PlacementKind.PLAIN or dest.kind not in (DestKind.ALLOCATE, DestKind.MEMORY):
        return value, dest
    note, attrs = _rank_part(p, shape, sharding.rank, sharding.world_size)
    if attrs is None:
        return value, replace(dest, shard=note)
    local_shape = attrs.local_shape
    node = Node(NodeKind.SHARD, _spec(local_shape, value.spec.dtype), (value,), attrs)
    local = replace(dest, spec=_spec(local_shape, dest.spec.dtype),
                    stride=row_major_strides(local_shape), shard=note)
    return node, local


@lru_cache(maxsize=CACHE_SIZE)
def _rank_part(p: Placement, shape: tuple[int, ...], rank: int, world_size: int
               ) -> tuple[DestShard, ShardAttrs | None]:
    """The note and (sharded) the shard attrs of ``rank``'s part of a tensor of ``shape``
    under ``p``: one object each for every tensor of that shape and placement (the layers
    of a model), made once per rank."""
    note = DestShard(p, shape, rank, world_size)
    if not p.is_sharded:
        return note, None
    boxes = tuple(pc.region for pc in pieces(p, shape, world_size, rank))
    return note, ShardAttrs(p, boxes, rank, world_size)


_spec = lru_cache(maxsize=CACHE_SIZE)(TensorSpec)  # (a local spec, shared like its shape)


def shard_sinks(nodes: tuple[Node, ...], loads: Collection[str], sharding: Sharding
                ) -> tuple[Node, ...]:
    """``nodes`` (a conversion's, in order) with the sink of each target in ``loads`` (one
    each) keeping this rank's part: a shard node before the sink where the target is
    sharded, the destination's note where it is a ``DTensor`` (see :func:`shard_target`);
    ``nodes`` itself when no sink changes."""
    start, found = len(nodes), 0
    while found < len(loads) and start > 0:  # (the sinks follow the stages: look from the end)
        start -= 1
        n = nodes[start]
        found += n.kind is NodeKind.SINK and sink_attrs(n).dest.key in loads
    out: list[Node] = []
    for n in nodes[start:]:
        dest = sink_attrs(n).dest if n.kind is NodeKind.SINK else None
        if dest is not None and dest.key in loads:
            value, local = shard_target(n.inputs[0], dest, dest.key, sharding)
            if value is not n.inputs[0]:
                out.append(value)
            if local is not dest:
                n = Node(NodeKind.SINK, value.spec, (value,), SinkAttrs(local))
        out.append(n)
    if all(map(is_, out, nodes[start:])) and len(out) == len(nodes) - start:
        return nodes
    return nodes[:start] + tuple(out)


def shard_fragments(node: Node, target: int, view: View) -> tuple[Fragment, ...]:
    """The shard's pieces of its input, each landing in its slice of ``view`` (local)."""
    assert isinstance(node.attrs, ShardAttrs), node
    a = node.attrs
    out, local = [], 0
    for box in a.pieces:
        if box.numel == 0:
            continue
        size = box.shape[a.placement.axis]
        out.append(Fragment(box, target, view.narrow(a.placement.axis, local, size)))
        local += size
    return tuple(out)


def plan_sharding(model: Any, tp: Any) -> Sharding:
    """Resolve ``tp`` (a :class:`~weightplan.TensorParallel`) for ``model`` on this
    rank: the mesh (given, the DTensor parameters', or the default group) and the plan.

    Raises:
        ParallelError: no process group and no dry-run rank, or a sharded parameter that is
            already allocated (tensor parallel loads into a model on ``meta``).
    """
    from weightplan.errors import ParallelError
    from weightplan.planner.core.sharding.config import Ranks
    from weightplan.planner.inputs.parallel_plan import dtensor_mesh, resolve_sharding

    mesh = dtensor_mesh(model)
    if mesh is not None and tp.mesh is None and tp.world_size is None:
        ranks = Ranks(mesh.size(), mesh.get_local_rank(), mesh)
    else:
        ranks = tp.ranks()
    plan = resolve_sharding(model, tp, ranks.world_size)
    for name, param in model.named_parameters():
        if plan.placement(name).is_dtensor and not param.is_meta:
            raise ParallelError(f"{name} is already allocated; tensor-parallel loading "
                                "allocates each rank's part: build the model on meta "
                                "(weightplan.init_empty() or torch.device('meta'))")
    return Sharding(plan, ranks.world_size, ranks.rank, tp.output, ranks.mesh,
                    tp.cooperative, tp.ranks_per_node(ranks), tp.storage)


def kept_sharding(sharding: Sharding, kept: Mapping[str, PackedWeight],
                  names: Callable[[str], str | None]) -> Sharding:
    """``sharding`` with the parts of every kept packed weight (keep-quantized: the model
    holds the stored tensors) placed as their weight's slice needs
    (:mod:`~weightplan.planner.core.sharding.kept_packed`); ``names``: the model's name of
    a checkpoint key (``None``: not held). The weight's placement is its plan's style
    applied to the logical weight.

    Raises:
        ParallelError: a kept weight whose shards can't hold whole quantization groups, or
            whose parts DTensor's chunks can't split as the weight's slices need.
    """
    from weightplan.errors import ParallelError
    from weightplan.planner.core.sharding import styles
    from weightplan.planner.core.sharding.kept_packed import kept_part_placements
    from weightplan.planner.inputs.parallel_plan import ParamSharding

    params = dict(sharding.plan.params)
    changed = False
    for weight in kept.values():
        held = [names(p.key) for p in weight.parts]
        entries = [params[n] for n in held if n is not None and n in params]
        rule = next((e for e in entries if e.style is not None), None)
        if rule is None or None in held:
            continue  # (no style names it: plain on every rank, as a plain tensor)
        first = held[0]
        assert first is not None and rule.style is not None
        suffix = weight.parts[0].key[len(weight.key):]
        logical_name = first[:len(first) - len(suffix)] if suffix else first
        logical = styles.placement_for(rule.style, logical_name, len(weight.shape))
        roles = tuple(n for n in held if n is not None)
        placed = kept_part_placements(weight.scheme, weight.shape,
                                      tuple(tuple(p.spec.shape) for p in weight.parts),
                                      logical, sharding.world_size, roles)
        if placed.problem is not None:
            raise ParallelError(f"{logical_name} (kept quantized, {weight.scheme.describe()}, "
                                f"{rule.style} over {sharding.world_size} ranks): "
                                f"{placed.problem}; load it dequantized (a floating model) "
                                "or pick a world size that splits it on whole units")
        for name, placement in zip(roles, placed.placements, strict=True):
            params[name] = ParamSharding(name, placement, rule.style, rule.rule)
        shape_name = names(weight.key.rsplit(".", 1)[0] + ".weight_shape")
        if shape_name is not None:  # (the global shape, whole on every rank)
            params[shape_name] = ParamSharding(shape_name, Placement.replicate()
                                               if logical.is_dtensor else Placement.plain(),
                                               rule.style, rule.rule)
        changed = True
    if not changed:
        return sharding
    return replace(sharding, plan=replace(sharding.plan, params=MappingProxyType(params)))
