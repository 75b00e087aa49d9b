"""Bulk, identity-based proofs that a graph and its steps break none of ``verify``'s
invariants, for ~140k nodes in C-level passes (``map``, ``zip``, set algebra).

Each function answers ``True`` only when the exact, per-node check in
:mod:`~weightplan.planner.tensors.verify.verify` would find nothing: it tests a *stronger*
condition (inputs listed earlier *as the same object*, no two run nodes with equal
hashes, ...). ``False`` means "not proven": the exact check runs and words each problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, eq, is_, itemgetter, lt
from typing import TYPE_CHECKING

from weightplan.planner.tensors.ir.nodes import ATTRS_OF, Node, NodeKind

if TYPE_CHECKING:
    from weightplan.planner.tensors.lower.placement import Step

_INPUTS, _KIND, _ATTRS_TYPE = attrgetter("inputs"), attrgetter("kind"), attrgetter("attrs.__class__")
_SHAPE, _DTYPE, _ATTRS_DTYPE = (attrgetter("spec.shape"), attrgetter("spec.dtype"),
                                attrgetter("attrs.dtype"))
_SPEC, _DEST, _WRITTEN = attrgetter("spec"), attrgetter("attrs.dest"), attrgetter("written")
_HASH = attrgetter("_hash")  # equal nodes have equal hashes (Node.__hash__ returns it)
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
    try:
        sources = list(map(position.__getitem__, map(id, chain.from_iterable(inputs))))
    except KeyError:  # an input that is not (as this object) in the graph
        return False
    # each edge's consumer place (nodes without inputs: ~2/3 of an FP8 plan's, skipped)
    consumers = chain.from_iterable(map(repeat, compress(range(count), arities),
                                        compress(arities, arities)))
    if not all(map(lt, sources, consumers)):
        return False
    kinds = list(map(_KIND, nodes))
    triples = set(zip(kinds, map(_ATTRS_TYPE, nodes), arities, strict=True))
    for kind, attrs, n in triples:
        want = arity.get(kind)
        if not issubclass(attrs, ATTRS_OF[kind]) or (want is not None and n != want) or (
                kind is NodeKind.OP and n == 0):
            return False
    # the triples hold: sinks, dequantizes, casts, ... all have inputs (~1/3 of the nodes)
    fed, fed_kinds = list(compress(nodes, arities)), list(compress(kinds, arities))
    sinks = list(compress(fed, map(is_, fed_kinds, repeat(NodeKind.SINK))))
    consumed = set(sources)  # the places of consumed nodes: all but the sinks'
    if len(consumed) - len(consumed.intersection(map(position.__getitem__, map(id, sinks)))) \
            != count - len(sinks):
        return False
    present = {kind for kind, _, _ in triples}
    dequantizes: list[Node] = []
    if NodeKind.DEQUANTIZE in present:
        dequantizes = list(compress(fed, map(is_, fed_kinds, repeat(NodeKind.DEQUANTIZE))))
    others: Iterable[Node] = sinks
    if present & _ONE_INPUT - {NodeKind.SINK}:  # casts, shards, quantizes: find them
        others = compress(fed, map(_ONE_INPUT.__contains__, fed_kinds))
    return specs_hold(dequantizes, others, node_problems) and one_producer(sinks)


def specs_hold(dequantizes: Sequence[Node], others: Iterable[Node],
               node_problems: Callable[[Node], list[str]], sinks: Sequence[Node] = ()) -> bool:
    """The spec rules: in bulk for the many dequantize nodes (one per FP8 expert weight:
    shape kept, dtype the attrs') and for ``sinks`` (one per tensor loaded), the exact
    per-node check for the ``others`` with inputs (casts, shards, quantizes, sinks; their
    (kind, attrs, arity) checked: each has its one input)."""
    if dequantizes and (
            list(map(_SHAPE, dequantizes))
            != list(map(_SHAPE, map(itemgetter(0), map(_INPUTS, dequantizes))))
            or not all(map(eq, map(_DTYPE, dequantizes), map(_ATTRS_DTYPE, dequantizes)))):
        return False
    return _sinks_hold(sinks) and not any(map(node_problems, others))


def _sinks_hold(sinks: Sequence[Node]) -> bool:
    """A sink's spec is its input's and, when written, its destination's (as
    :func:`~weightplan.planner.tensors.verify.verify.check_node` has it), for all of them at once."""
    specs = list(map(_SPEC, sinks))
    if specs != list(map(_SPEC, map(itemgetter(0), map(_INPUTS, sinks)))):
        return False
    dests = list(map(_DEST, sinks))
    written = list(map(_WRITTEN, dests))
    return list(map(_SPEC, compress(dests, written))) == list(compress(specs, written))


def one_producer(sinks: Iterable[Node]) -> bool:
    """No two written sinks name one model tensor."""
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
    return (all(map(position.__contains__, map(id, ran)))
            and len(set(map(_HASH, ran))) == len(ran))
