"""``verify(graph)``: structural invariants of a plan graph, checked wherever it changes.

Checks: the graph is acyclic; every node's inputs are in the graph and wired in order;
reads have no inputs and assigns have exactly one; specs agree across casts and
assigns; each model tensor has exactly one producer.
"""

from __future__ import annotations

import networkx as nx

from weightplan.errors import PlanError
from weightplan.planner.tensors.nodes import Node, NodeKind


def verify(graph: nx.DiGraph) -> None:
    """Raise :class:`PlanError` naming the node when an invariant is broken."""
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise PlanError(f"plan graph has a cycle through {cycle[0][0]!r}")
    producers: dict[str, Node] = {}
    for node in graph.nodes:
        _check_inputs(graph, node)
        _check_kind(node)
        if node.kind is NodeKind.ASSIGN:
            for alias in node.attrs.aliases:
                other = producers.setdefault(alias, node)
                if other is not node:
                    raise PlanError(f"model tensor {alias} has two producers: {other!r} and "
                                    f"{node!r}")


def _check_inputs(graph: nx.DiGraph, node: Node) -> None:
    for source in node.inputs:
        if source not in graph:
            raise PlanError(f"{node!r} uses {source!r}, which is not in the graph")
        if graph.edges[source, node].get("slot") is None:
            raise PlanError(f"edge {source!r} → {node!r} has no input slot")


def _check_kind(node: Node) -> None:
    if node.kind is NodeKind.READ and node.inputs:
        raise PlanError(f"{node!r}: a read has no inputs")
    if node.kind in (NodeKind.CAST, NodeKind.ASSIGN):
        if len(node.inputs) != 1:
            raise PlanError(f"{node!r} needs exactly one input, has {len(node.inputs)}")
        if node.inputs[0].spec.shape != node.spec.shape:
            raise PlanError(f"{node!r}: shape {list(node.spec.shape)} differs from its input "
                            f"{node.inputs[0]!r}")
    if node.kind is NodeKind.ASSIGN and node.inputs[0].spec.dtype != node.spec.dtype:
        raise PlanError(f"{node!r}: dtype differs from its input {node.inputs[0]!r}; a cast "
                        "node is missing")
