"""Bulk, identity-based proofs that a graph and its steps break none of ``verify``'s
invariants, for ~140k nodes in C-level passes (``map``, ``zip``, set algebra).

Each function answers ``True`` only when the exact, per-node check in
:mod:`~weightplan.planner.tensors.verify` would find nothing: it tests a *stronger*
condition (inputs listed earlier *as the same object*, no two run nodes with equal
hashes, ...). ``False`` means "not proven": the exact check runs and words each problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, is_, lt
from typing import TYPE_CHECKING

from weightplan.planner.tensors.nodes import ATTRS_OF, DequantizeAttrs, Node, NodeKind

if TYPE_CHECKING:
    from weightplan.planner.tensors.placement import Step

_INPUTS, _KIND, _ATTRS = attrgetter("inputs"), attrgetter("kind"), attrgetter("attrs")
_ONE_INPUT = frozenset((NodeKind.CAST, NodeKind.SINK, NodeKind.SHARD, NodeKind.QUANTIZE))


def node_positions(nodes: Sequence[Node]) -> dict[int, int]:
    """``id(node)`` → its place in ``nodes`` (a node listed twice: its last place)."""
    return dict(zip(map(id, nodes), range(len(nodes)), strict=True))


def graph_is_sound(nodes: Sequence[Node], position: dict[int, int], arity: dict[NodeKind, int],
                   node_problems: Callable[[Node], list[str]]) -> bool:
    """No node uses an input listed after it (or not at all), every (kind, attrs, arity)
    is well formed, every spec rule holds, every non-sink is consumed, and no two sinks
    write one model tensor. ``position``: :func:`node_positions` of ``nodes``."""
    count = len(nodes)
    inputs = list(map(_INPUTS, nodes))
    arities = list(map(len, inputs))
    used = list(map(id, chain.from_iterable(inputs)))
    consumers = chain.from_iterable(map(repeat, range(count), arities))
    if not all(map(lt, map(position.get, used, repeat(count)), consumers)):
        return False
    kinds = list(map(_KIND, nodes))
    for kind, attrs, n in set(zip(kinds, map(type, map(_ATTRS, nodes)), arities, strict=True)):
        want = arity.get(kind)
        if not issubclass(attrs, ATTRS_OF[kind]) or (want is not None and n != want) or (
                kind is NodeKind.OP and n == 0):
            return False
    if not _specs_hold(nodes, kinds, node_problems):
        return False
    unconsumed = position.keys() - set(used)
    if any(nodes[position[i]].kind is not NodeKind.SINK for i in unconsumed):
        return False
    return _one_producer(compress(nodes, map(is_, kinds, repeat(NodeKind.SINK))))


def _specs_hold(nodes: Sequence[Node], kinds: list[NodeKind],
                node_problems: Callable[[Node], list[str]]) -> bool:
    """The spec rules: inline for the many dequantize nodes (one per FP8 expert weight),
    the exact per-node check for the few other nodes with inputs."""
    dequantize = NodeKind.DEQUANTIZE
    for node in compress(nodes, map(is_, kinds, repeat(dequantize))):
        a, spec = node.attrs, node.spec
        assert isinstance(a, DequantizeAttrs)  # the (kind, attrs) pairs were checked
        if node.inputs[0].spec.shape != spec.shape or spec.dtype != a.dtype:
            return False
    others = map(_ONE_INPUT.__contains__, kinds)  # (each has its one input: arities checked)
    return not any(node_problems(node) for node in compress(nodes, others))


def _one_producer(sinks: Iterable[Node]) -> bool:
    producers: dict[str, Node] = {}
    for node in sinks:
        dest = node.attrs.dest  # type: ignore[union-attr]
        if dest.written:
            for alias in dest.aliases:
                if producers.setdefault(alias, node) is not node:
                    return False
    return True


def release_is_sound(position: dict[int, int], steps: Sequence["Step"]) -> bool:
    """Every node a step runs is (as an object) in the graph (``position``: its
    :func:`node_positions`), and no two run nodes are equal: their hashes differ, so no
    node is released twice."""
    ran: list[Node] = []
    for step in steps:
        ran.extend(chain.from_iterable(step.sources))
        for stage in step.materialize:
            ran.extend(chain.from_iterable(stage))
        ran.extend(step.sinks)
    if not position.keys() >= set(map(id, ran)):
        return False
    return len(set(map(hash, ran))) == len(ran)
