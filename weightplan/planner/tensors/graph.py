"""The plan's DAG: checkpoint reads → ops → casts → model assignments, in networkx."""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from weightplan.planner.tensors.nodes import Node


def build_graph(nodes: Iterable[Node]) -> nx.DiGraph:
    """A ``DiGraph`` whose nodes are :class:`Node` s and whose edges run input → consumer.

    Edge attribute ``slot`` is the input's position (inputs are ordered).
    """
    graph = nx.DiGraph()
    for node in nodes:
        graph.add_node(node)
        for slot, source in enumerate(node.inputs):
            graph.add_edge(source, node, slot=slot)
    return graph
