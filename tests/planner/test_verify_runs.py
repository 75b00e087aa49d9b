"""The proof per conversion run (``verify_runs``): it proves sound plans, refuses every
broken graph or step (so the exact checks run), and ``check`` says the same with or
without the runs hint."""

import dataclasses

import pytest
import torch

from weightplan.ops import MergeModulelist
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.destination import DestKind
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ReadAttrs, SinkAttrs
from weightplan.planner.tensors.lower.placement import plan_step
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.verify.verify import _ARITY, check, check_node
from weightplan.planner.tensors.verify.verify_runs import _alike, release_by_runs, runs_are_sound

from tests.planner.core import checkpoint, conversion, entry
from tests.planner.test_verify import broken_graphs, read_node, sink


@pytest.fixture(autouse=True)
def runs_of_any_length(monkeypatch):
    """``check`` proves runs one by one however short they are (these runs are tiny)."""
    monkeypatch.setattr("weightplan.planner.tensors.verify.verify._LONG_RUNS", 0)


def stacks(count=4):
    """``count`` conversions of one shape (three experts merged), their steps, checkpoint."""
    convs, entries = [], []
    for c in range(count):
        experts = [entry(f"l{c}.e.{i}.w", (2, 3), 24 * (3 * c + i)) for i in range(3)]
        convs.append(conversion([experts], [f"w{c}"], [MergeModulelist(0)]))
        entries += experts
    return convs, [plan_step(c) for c in convs], checkpoint(*entries)


def proof(nodes, lengths):
    return runs_are_sound(tuple(nodes), lengths, _ARITY, check_node)


def same_either_way(nodes, lengths, steps=(), ckpt=None):
    """``check`` with the runs hint equals ``check`` without it (the whole-graph proof and
    the exact checks)."""
    graph = PlanGraph(tuple(nodes))
    with_runs = check(graph, steps, ckpt, lengths)
    assert with_runs == check(graph, steps, ckpt)
    return with_runs


def test_runs_of_one_shape_are_proven_by_one_proof(monkeypatch):
    convs, steps, ckpt = stacks()
    graph = plan_graph(convs)
    lengths = [len(c.nodes) for c in convs]
    proven = proof(graph.nodes, lengths)
    assert proven is not None
    shapes, runs = proven
    assert len({id(s) for s in shapes}) == 1 and len(runs) == len(convs)
    assert release_by_runs(runs, shapes, steps)
    assert same_either_way(graph.nodes, lengths, steps, ckpt) == []

    def whole_graph(nodes):
        raise AssertionError("proven run by run: no whole-graph proof")

    monkeypatch.setattr("weightplan.planner.tensors.verify.verify.node_positions", whole_graph)
    assert check(graph, steps, ckpt, lengths) == []


def test_every_broken_graph_is_refused_and_judged_exactly():
    for nodes in broken_graphs():
        assert proof(nodes, [len(nodes)]) is None, nodes
        assert same_either_way(nodes, [len(nodes)]), nodes


def test_a_run_that_breaks_its_shared_shape_is_refused():
    """A later run of a proven shape is compared with the shape's proof: an input that
    moved (still sound: a shape of its own), or that is broken, is not taken on trust."""
    r1, q1, r2, q2 = read_node("r1"), read_node("q1", 24), read_node("r2", 48), read_node("q2", 72)
    first = (r1, q1, sink(r1, "r1"), sink(q1, "q1"))
    swapped = (r2, q2, sink(q2, "q2"), sink(r2, "r2"))
    assert proof(first + swapped, [4, 4]) is not None
    outside = (r2, q2, sink(r1, "r2"), sink(q2, "q2"))  # an input in the run before
    assert proof(first + outside, [4, 4]) is None
    assert same_either_way(first + outside, [4, 4])  # r2: no consumer, r1: two producers
    late = (r2, q2, sink(q2, "q2"), sink(q2, "r2"))
    assert proof(first + late, [4, 4]) is None
    assert "no consumer" in same_either_way(first + late, [4, 4])[0]
    bad = Node(NodeKind.SINK, TensorSpec((3, 2), torch.float32), (q2,), sink(q2, "q2").attrs)
    assert proof(first + (r2, q2, sink(r2, "r2"), bad), [4, 4]) is None
    assert same_either_way(first + (r2, q2, sink(r2, "r2"), bad), [4, 4])


def test_a_sink_whose_destination_disagrees_is_refused_in_bulk():
    """The sinks' spec rule is checked for all of them at once: a written destination of
    another spec (the input's spec kept) fails the proof, and the exact check words it;
    a discarded one has no spec to agree with."""
    r1, q1, r2, q2 = read_node("r1"), read_node("q1", 24), read_node("r2", 48), read_node("q2", 72)
    first = (r1, q1, sink(r1, "r1"), sink(q1, "q1"))
    other = dataclasses.replace(sink(q2, "q2").attrs.dest, spec=TensorSpec((3, 2), torch.float32))
    wrong = Node(NodeKind.SINK, q2.spec, (q2,), SinkAttrs(other))
    nodes = first + (r2, q2, sink(r2, "r2"), wrong)
    assert proof(nodes, [4, 4]) is None
    assert "destination" in same_either_way(nodes, [4, 4])[0]
    dropped = Node(NodeKind.SINK, q2.spec, (q2,),
                   SinkAttrs(dataclasses.replace(other, kind=DestKind.DISCARD)))
    assert proof(first + (r2, q2, sink(r2, "r2"), dropped), [4, 4]) is not None


def test_a_wrong_hint_only_costs_the_fast_proof():
    convs, steps, ckpt = stacks(2)
    graph = plan_graph(convs)
    n = len(convs[0].nodes)
    for lengths in ([n, n + 1], [n - 1, n + 1], [2 * n], [1] * (2 * n)):
        assert same_either_way(graph.nodes, lengths, steps, ckpt) == []
    assert proof(graph.nodes, [n - 1, n + 1]) is None


def test_a_step_run_twice_or_outside_the_graph_is_refused():
    convs, steps, ckpt = stacks(2)
    graph = plan_graph(convs)
    lengths = [len(c.nodes) for c in convs]
    shapes, runs = proof(graph.nodes, lengths)
    for distinct in (False, True):  # (a graph of distinct nodes: each step in its own run)
        assert release_by_runs(runs, shapes, steps, distinct)
        assert not release_by_runs(runs, shapes, [steps[0], steps[0]], distinct)
    assert graph.distinct and not PlanGraph(graph.nodes).distinct
    assert "would be released twice" in same_either_way(graph.nodes, lengths, [steps[0]] * 2,
                                                        ckpt)[0]
    other = stacks(3)[1][2]  # a step of a conversion that is not in the graph
    assert not release_by_runs(runs, shapes, [steps[0], other])
    assert "not in the graph" in same_either_way(graph.nodes, lengths, [steps[0], other],
                                                 ckpt)[0]


def test_an_equal_input_that_is_another_object_is_accepted_as_the_exact_pass_does():
    r = read_node()
    copy = Node(r.kind, r.spec, r.inputs, r.attrs)
    assert same_either_way((r, sink(copy)), [2]) == []


F32 = TensorSpec((2, 3), torch.float32)


def test_a_later_run_with_other_arities_is_refused():
    r1, q1, r2, q2 = read_node("r1"), read_node("q1", 24), read_node("r2", 48), read_node("q2", 72)
    first = (r1, q1, sink(r1, "r1"), sink(q1, "q1"))
    two = dataclasses.replace(sink(r2, "r2"), inputs=(r2, q2))
    fed_read = dataclasses.replace(q2, inputs=(r2,))
    for later in [(r2, q2, two, sink(q2, "q2")), (r2, fed_read, sink(r2, "r2"), sink(fed_read, "q2"))]:
        assert proof(first + later, [4, 4]) is None
        assert same_either_way(first + later, [4, 4])


def dequantized_run(tag="a", count=16, shapes=None, dtype=torch.bfloat16):
    """``count`` FP8 weights and scales, dequantized into one shared spec, each sunk."""
    from weightplan.planner.tensors.ir.nodes import DequantizeAttrs

    fp8, scale = TensorSpec((2, 3), torch.float8_e4m3fn), TensorSpec((1, 1), torch.float32)
    out, attrs = TensorSpec((2, 3), torch.bfloat16), DequantizeAttrs(dtype, (128, 128))
    weights = [Node(NodeKind.READ, fp8, (), ReadAttrs(entry(f"w{i}", (2, 3), 6 * i,
                                                            torch.float8_e4m3fn), (0, i)))
               for i in range(count)]
    scales = [Node(NodeKind.READ, scale, (), ReadAttrs(entry(f"s{i}", (1, 1), 4 * i), (1, i)))
              for i in range(count)]
    specs = shapes or [out] * count
    dqs = [Node(NodeKind.DEQUANTIZE, spec, (w, s), attrs)
           for spec, w, s in zip(specs, weights, scales, strict=True)]
    return (*weights, *scales, *dqs, *(sink(d, f"{tag}{i}") for i, d in enumerate(dqs)))


def dequantizes(run):
    return tuple(n for n in run if n.kind is NodeKind.DEQUANTIZE)


def test_a_stack_of_dequantizes_sharing_a_spec_is_proven_once_and_a_broken_one_refused():
    run = dequantized_run()
    assert proof(run + dequantized_run("b"), [len(run)] * 2) is not None
    assert same_either_way(run, [len(run)]) == []
    assert _alike(dequantizes(run))  # (one spec rule judged for all sixteen)
    odd = [TensorSpec((2, 3), torch.bfloat16)] * 15 + [TensorSpec((3, 2), torch.bfloat16)]
    for broken in (dequantized_run("b", shapes=odd), dequantized_run("b", dtype=torch.float16)):
        assert not _alike(dequantizes(broken))
        assert proof(run + broken, [len(run)] * 2) is None
        assert "dequantize keeps the shape" in same_either_way(run + broken, [len(run)] * 2)[0]
