"""The plan's DAG: every conversion's nodes, reads → ops → casts → sinks, in one container.

The container is ours, not networkx's: a tuple of frozen nodes in topological order
(every node after its inputs), the edges being each node's ordered ``inputs``. Building
it costs nothing per key beyond the nodes themselves, which matters for checkpoints with
~100k keys; :meth:`PlanGraph.to_networkx` builds a ``networkx.DiGraph`` view lazily for
drawing and for anyone who wants graph algorithms.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING

from weightplan.planner.core.geometry import Region
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ShardAttrs
from weightplan.planner.core.spec import TensorSpec

if TYPE_CHECKING:
    import networkx as nx

_HASH = attrgetter("_hash")  # Node's hash, computed once when it is made


@dataclass(frozen=True, slots=True)
class Edge:
    """``source`` flows into input ``slot`` of ``target``: ``region`` of a tensor of ``spec``."""

    source: Node
    target: Node
    slot: int

    @property
    def spec(self) -> TensorSpec:
        return self.source.spec

    @property
    def regions(self) -> tuple[Region, ...]:
        """The parts of the source the target consumes (a shard's pieces, else all of it)."""
        a = self.target.attrs
        return a.pieces if isinstance(a, ShardAttrs) else (Region.full(self.source.spec.shape),)

    @property
    def region(self) -> Region:
        """The box enclosing :attr:`regions` (a ``_StridedShard`` consumes parts of it)."""
        boxes = self.regions
        return Region(tuple(min(s) for s in zip(*(b.starts for b in boxes), strict=True)),
                      tuple(max(s) for s in zip(*(b.stops for b in boxes), strict=True)))


@dataclass(frozen=True)
class PlanGraph:
    """Nodes in topological order; see the module docstring."""

    nodes: tuple[Node, ...]
    # no two nodes are equal (known where :meth:`of` made the graph; else not looked at)
    distinct: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> "PlanGraph":
        """Nodes in the order given, each once (equal subgraphs are one node)."""
        given = tuple(nodes)
        # equal nodes have equal hashes: when no two hashes (cached on the nodes, read
        # without a Python __hash__ call each) are equal, every node is already distinct
        if len(set(map(_HASH, given))) == len(given):
            return cls(given, True)
        return cls(tuple(dict.fromkeys(given)), True)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node: object) -> bool:
        return node in self._members

    @cached_property
    def _members(self) -> frozenset[Node]:
        return frozenset(self.nodes)

    def edges(self) -> Iterator[Edge]:
        for node in self.nodes:
            for slot, source in enumerate(node.inputs):
                yield Edge(source, node, slot)

    def consumers(self) -> dict[Node, list[Node]]:
        """Node → the nodes that take it as an input (each once, in graph order)."""
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for node in self.nodes:
            for source in dict.fromkeys(node.inputs):
                out.setdefault(source, []).append(node)
        return out

    def of_kind(self, kind: NodeKind) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.kind is kind)

    def to_networkx(self) -> "nx.DiGraph":
        """A ``DiGraph`` view (edge attribute ``slot``: the input's position)."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(self.nodes)
        graph.add_edges_from((e.source, e.target, {"slot": e.slot}) for e in self.edges())
        return graph
