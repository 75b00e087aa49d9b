"""The graph container by hand: order, edges with what flows, consumers, the networkx view."""

import networkx as nx
import torch

from weightplan.ops import MergeModulelist
from weightplan.planner.tensors.geometry import Region
from weightplan.planner.tensors.graph import Edge, PlanGraph
from weightplan.planner.tensors.lower import plan_graph
from weightplan.planner.tensors.nodes import Node, NodeKind, ShardAttrs
from weightplan.planner.tensors.spec import TensorSpec

from tests.planner.core import conversion, entry


def merged_graph():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(2)]
    return plan_graph([conversion([experts], ["w"], [MergeModulelist(0)])])


def test_nodes_come_after_their_inputs_and_edges_carry_specs():
    graph = merged_graph()
    assert [n.kind for n in graph] == [NodeKind.READ, NodeKind.READ, NodeKind.OP, NodeKind.SINK]
    edges = list(graph.edges())
    assert [(e.source.label, e.slot, e.spec) for e in edges[:2]] == [
        ("e.0.w", 0, TensorSpec((2, 3), torch.float32)),
        ("e.1.w", 1, TensorSpec((2, 3), torch.float32))]
    assert all(e.region == Region.full(e.source.spec.shape) for e in edges)
    merge = graph.nodes[2]
    assert graph.consumers()[merge] == [graph.nodes[3]] and graph.consumers()[graph.nodes[3]] == []


def test_a_shard_edge_carries_its_region():
    read = merged_graph().nodes[0]
    half = Region((0, 0), (1, 3))
    shard = Node(NodeKind.SHARD, TensorSpec((1, 3), torch.float32), (read,), ShardAttrs(half, 0, 2))
    assert Edge(read, shard, 0).region == half


def test_equal_subgraphs_are_one_node_and_networkx_is_a_view():
    graph = merged_graph()
    twice = PlanGraph.of(list(graph) + list(merged_graph()))
    assert len(twice) == len(graph)
    view = graph.to_networkx()
    assert nx.is_directed_acyclic_graph(view) and view.number_of_edges() == 3
