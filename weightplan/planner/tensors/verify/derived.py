"""Invariants 1-3 of a graph that differs from a proven one only in the tails of its parts.

Ranks planned together share every conversion's front (its reads, dequantizes and ops,
as objects) and differ in its tail: the shard nodes and sinks each rank keeps
(:func:`~weightplan.planner.tensors.ir.build.shard_conversion`). The graph of the
conversions no rank changed yet, the *base*, is proven once (:func:`graph_holds`, one
segment per conversion: :func:`base_of`); a rank's graph is then the base's parts, some
with their tail replaced, and :func:`derived` looks only at the replaced tails:

1. each node of a new tail is well formed and keeps its kind's spec rule; each of its
   inputs is a node of the tail before it, or a node before the tail that the replaced
   tail consumed (so, by the base's proof, a node of its part listed earlier);
2. no node is listed twice in the tail; every node of it but its sinks is consumed later
   in it, and every node before the tail that the replaced tail consumed is consumed by
   the new one;
3. every model tensor has one producer: the tails' sinks write none twice, and none the
   base writes outside the replaced tails;
4. the new nodes are distinct from each other and from every node of the base (their
   hashes differ), so the graph is :meth:`PlanGraph.of`'s without a pass over its nodes.

The result is the :class:`Segments` :func:`graph_holds` would prove, one per part. When
anything is not shown so, :func:`derived` says ``None``: the graph is made and checked
whole, as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress, count, repeat
from operator import attrgetter, is_, is_not

from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.nodes import Node, NodeKind
from weightplan.planner.tensors.verify.graph_checks import (
    SPEC_RULED, Segments, graph_holds, spec_problems, well_formed, written_aliases,
)

Part = tuple[Node, ...]  # a conversion's nodes, in order
_HASH, _KIND = attrgetter("_hash"), attrgetter("kind")
_RULED = SPEC_RULED | {NodeKind.DEQUANTIZE}


@dataclass(frozen=True, slots=True)
class Base:
    """A proven graph of distinct nodes, made of ``parts``, one segment each."""

    parts: tuple[Part, ...]
    segments: Segments
    hashes: frozenset[int]  # its nodes'
    written: frozenset[str]  # the model tensors its sinks write


def base_of(parts: Sequence[Part]) -> Base | None:
    """``parts`` as a base (see the module docstring); ``None`` when their graph is not
    proven one segment per part, or two of its nodes may be equal."""
    nodes = tuple(chain.from_iterable(parts))
    segments = graph_holds(nodes)
    if segments is None or segments.ends != list(accumulate(map(len, parts))):
        return None
    hashes = frozenset(map(_HASH, nodes))
    if len(hashes) != len(nodes):
        return None
    sinks = compress(nodes, map(is_, map(_KIND, nodes), repeat(NodeKind.SINK)))
    return Base(tuple(parts), segments, hashes, frozenset(written_aliases(list(sinks))))


def derived(base: Base, parts: Sequence[Part]) -> tuple[PlanGraph, Segments] | None:
    """The graph of ``parts`` and its segments, proven from ``base`` (see the module
    docstring); ``None``: not shown so."""
    if len(parts) != len(base.parts):
        return None
    proofs = list(base.segments.proofs)
    home = dict(base.segments.home)
    tails: dict[tuple[int, int, tuple[NodeKind, ...]], int] = {}  # (their proof indices)
    forms: set[tuple[NodeKind, type, int]] = set()  # the tails' (kind, attrs type, arity)
    fresh: list[Node] = []  # the nodes no part of the base has
    dropped: list[Node] = []  # the replaced tails' sinks
    added: list[Node] = []  # the new tails' sinks
    for k, old, new in zip(count(), base.parts, parts):
        if new is old:
            continue
        start = next(compress(count(), map(is_not, old, new)), min(len(old), len(new)))
        gone, tail = old[start:], new[start:]
        kept = set(map(id, gone))
        if not _tail_holds(kept, gone, tail, forms):
            return None
        fresh += (n for n in tail if id(n) not in kept)
        sinks = [n for n in gone if n.kind is NodeKind.SINK]
        dropped += sinks
        for sink in sinks:
            del home[id(sink)]
        sinks = [n for n in tail if n.kind is NodeKind.SINK]
        added += sinks
        home.update(zip(map(id, sinks), repeat(k)))
        key = (base.segments.proofs[k], start, tuple(map(_KIND, tail)))
        proofs[k] = tails.setdefault(key, len(base.segments.ends) + len(tails))
    if not all(well_formed(*form) for form in forms):
        return None
    hashes = set(map(_HASH, fresh))
    if len(hashes) != len(fresh) or not hashes.isdisjoint(base.hashes):
        return None
    written = written_aliases(added)
    if len(set(written)) != len(written) or \
            not (base.written - set(written_aliases(dropped))).isdisjoint(written):
        return None
    nodes = tuple(chain.from_iterable(parts))
    return PlanGraph(nodes, True), Segments(nodes, list(accumulate(map(len, parts))), proofs,
                                            home)


def _tail_holds(kept: set[int], gone: Part, tail: Part,
                forms: set[tuple[NodeKind, type, int]]) -> bool:
    """Checks 1 and 2 of the module docstring for ``tail`` in place of ``gone`` (``kept``:
    the ids of ``gone``'s nodes); each node's (kind, attrs type, arity) is added to
    ``forms``, to be judged once for all tails."""
    fed = {id(x) for n in gone for x in n.inputs} - kept  # (nodes before the tail)
    seen: set[int] = set()
    used: set[int] = set()
    for n in tail:
        ids = set(map(id, n.inputs))
        if id(n) in seen or not ids - fed <= seen:
            return False
        if n.kind in _RULED and spec_problems(n):
            return False
        forms.add((n.kind, type(n.attrs), len(n.inputs)))
        used |= ids
        seen.add(id(n))
    return fed <= used and all(id(n) in used for n in tail if n.kind is not NodeKind.SINK)
