"""The graph container by hand: order, edges with what flows, consumers, the networkx view."""

import networkx as nx
import torch

from weightplan.ops import MergeModulelist
from weightplan.planner.core.geometry import Region
from weightplan.planner.tensors.ir.graph import Edge, PlanGraph
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ShardAttrs
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.core.spec import TensorSpec

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
    attrs = ShardAttrs(Placement.shard(0), (half,), 0, 2)
    shard = Node(NodeKind.SHARD, TensorSpec((1, 3), torch.float32), (read,), attrs)
    assert Edge(read, shard, 0).region == half and Edge(read, shard, 0).regions == (half,)
    halves = (Region((0, 0), (1, 1)), Region((0, 2), (1, 3)))  # a strided shard's two blocks
    strided = Node(NodeKind.SHARD, TensorSpec((1, 2), torch.float32), (read,),
                   ShardAttrs(Placement.strided(1, 2), halves, 0, 2))
    assert Edge(read, strided, 0).regions == halves
    assert Edge(read, strided, 0).region == Region((0, 0), (1, 3))


def test_equal_subgraphs_are_one_node_and_networkx_is_a_view():
    graph = merged_graph()
    twice = PlanGraph.of(list(graph) + list(merged_graph()))
    assert len(twice) == len(graph)
    view = graph.to_networkx()
    assert nx.is_directed_acyclic_graph(view) and view.number_of_edges() == 3


def test_nodes_whose_hashes_collide_stay_apart():
    first, second = merged_graph().nodes[:2]
    object.__setattr__(second, "_hash", first._hash)  # unequal nodes, one hash
    assert PlanGraph.of([first, second, first]).nodes == (first, second)
    assert PlanGraph.of([first, second]).nodes == (first, second)
