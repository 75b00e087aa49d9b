"""The graph proved a segment at a time (``graph_holds``): segments of one kind sequence
share a proof, yet every input of every segment is compared; whatever it doesn't prove,
the per-node pass judges, and the two agree on every graph (a property test)."""

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.ops import MergeModulelist
from weightplan.planner.core.quant.formats import Scheme
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.destination import DestKind
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.nodes import (
    DequantizeAttrs, Node, NodeKind, ReadAttrs, SinkAttrs,
)
from weightplan.planner.tensors.lower.placement import plan_step
from weightplan.planner.tensors.verify.graph_checks import graph_holds, graph_problems
from weightplan.planner.tensors.verify.verify import check, release_holds

from tests.planner.core import checkpoint, conversion, entry
from tests.planner.graph_mutations import mutated
from tests.planner.test_verify import broken_graphs, read_node, sink


def stacks(count=4):
    """``count`` conversions of one shape (three experts merged), their steps, checkpoint."""
    convs, entries = [], []
    for c in range(count):
        experts = [entry(f"l{c}.e.{i}.w", (2, 3), 24 * (3 * c + i)) for i in range(3)]
        convs.append(conversion([experts], [f"w{c}"], [MergeModulelist(0)]))
        entries += experts
    return convs, [plan_step(c) for c in convs], checkpoint(*entries)


def proven(nodes) -> bool:
    """Whether the segment proof shows ``nodes`` sound; when it does, so does the per-node
    pass (the proof never vouches for a graph the exact pass finds broken)."""
    segments = graph_holds(tuple(nodes))
    if segments is not None:
        assert graph_problems(PlanGraph(tuple(nodes))) == []
    return segments is not None


def test_segments_of_one_kind_sequence_share_one_proof():
    convs, steps, ckpt = stacks()
    graph = plan_graph(convs)
    segments = graph_holds(graph.nodes)
    assert segments is not None and len(segments.ends) == len(convs)
    assert len(set(segments.proofs)) == 1
    assert release_holds(segments, steps)
    assert check(graph, steps, ckpt) == []


def test_every_broken_graph_is_refused_and_worded():
    for nodes in broken_graphs():
        assert not proven(nodes), nodes
        assert graph_problems(PlanGraph(nodes)), nodes


def test_a_segment_that_breaks_its_shared_proof_is_refused():
    """A later segment of a proven kind sequence is compared with the proof: an input
    that moved (still sound: a proof of its own), or that is broken, is not taken on
    trust."""
    r1, q1, r2, q2 = read_node("r1"), read_node("q1", 24), read_node("r2", 48), read_node("q2", 72)
    first = (r1, q1, sink(r1, "r1"), sink(q1, "q1"))
    assert proven(first + (r2, q2, sink(q2, "q2"), sink(r2, "r2")))
    outside = (r2, q2, sink(r1, "r2"), sink(q2, "q2"))  # an input in the segment before
    assert not proven(first + outside)
    assert check(PlanGraph(first + outside))  # r2: no consumer, r1: two producers
    late = (r2, q2, sink(q2, "q2"), sink(q2, "r2"))
    assert not proven(first + late)
    assert "no consumer" in check(PlanGraph(first + late))[0]
    bad = Node(NodeKind.SINK, TensorSpec((3, 2), torch.float32), (q2,), sink(q2, "q2").attrs)
    assert not proven(first + (r2, q2, sink(r2, "r2"), bad))
    assert check(PlanGraph(first + (r2, q2, sink(r2, "r2"), bad)))


def test_a_sink_whose_destination_disagrees_is_refused():
    """A written destination of another spec (the input's spec kept) fails the proof and
    the per-node pass words it; a discarded one has no spec to agree with."""
    r1, q1, r2, q2 = read_node("r1"), read_node("q1", 24), read_node("r2", 48), read_node("q2", 72)
    first = (r1, q1, sink(r1, "r1"), sink(q1, "q1"))
    other = dataclasses.replace(sink(q2, "q2").attrs.dest, spec=TensorSpec((3, 2), torch.float32))
    wrong = Node(NodeKind.SINK, q2.spec, (q2,), SinkAttrs(other))
    nodes = first + (r2, q2, sink(r2, "r2"), wrong)
    assert not proven(nodes)
    assert "destination" in check(PlanGraph(nodes))[0]
    dropped = Node(NodeKind.SINK, q2.spec, (q2,),
                   SinkAttrs(dataclasses.replace(other, kind=DestKind.DISCARD)))
    assert proven(first + (r2, q2, sink(r2, "r2"), dropped))


def test_a_later_segment_with_other_arities_or_attrs_is_refused():
    r1, q1, r2, q2 = read_node("r1"), read_node("q1", 24), read_node("r2", 48), read_node("q2", 72)
    first = (r1, q1, sink(r1, "r1"), sink(q1, "q1"))
    two = dataclasses.replace(sink(r2, "r2"), inputs=(r2, q2))
    fed_read = dataclasses.replace(q2, inputs=(r2,))
    cast_attrs = dataclasses.replace(sink(q2, "q2"), attrs=ReadAttrs(q2.attrs.entry, (0, 1)))
    for later in [(r2, q2, two, sink(q2, "q2")), (r2, fed_read, sink(r2, "r2"), sink(fed_read, "q2")),
                  (r2, q2, sink(r2, "r2"), cast_attrs)]:
        assert not proven(first + later)
        assert check(PlanGraph(first + later))


def test_steps_run_twice_or_outside_the_graph_are_refused():
    convs, steps, ckpt = stacks(2)
    graph = plan_graph(convs)
    segments = graph_holds(graph.nodes)
    assert release_holds(segments, steps)
    assert not release_holds(segments, [steps[0], steps[0]])
    # a graph of distinct nodes (PlanGraph.of's): each step's own segment is enough
    assert graph.distinct and release_holds(segments, steps, graph.distinct)
    assert not release_holds(segments, [steps[0], steps[0]], graph.distinct)
    assert "would be released twice" in check(graph, [steps[0]] * 2, ckpt)[0]
    other = stacks(3)[1][2]  # a step of a conversion that is not in the graph
    assert not release_holds(segments, [steps[0], other])
    assert "not in the graph" in check(graph, [steps[0], other], ckpt)[0]


def dequantized(tag="a", count=16, shapes=None, dtype=torch.bfloat16):
    """``count`` FP8 weights and scales, dequantized into one shared spec, each sunk."""
    fp8, scale = TensorSpec((2, 3), torch.float8_e4m3fn), TensorSpec((1, 1), torch.float32)
    out, attrs = TensorSpec((2, 3), torch.bfloat16), DequantizeAttrs(dtype, (128, 128))
    weights = [Node(NodeKind.READ, fp8, (), ReadAttrs(entry(f"{tag}w{i}", (2, 3), 6 * i,
                                                            torch.float8_e4m3fn), (0, i)))
               for i in range(count)]
    scales = [Node(NodeKind.READ, scale, (), ReadAttrs(entry(f"{tag}s{i}", (1, 1), 4 * i), (1, i)))
              for i in range(count)]
    specs = shapes or [out] * count
    dqs = [Node(NodeKind.DEQUANTIZE, spec, (w, s), attrs)
           for spec, w, s in zip(specs, weights, scales, strict=True)]
    return (*weights, *scales, *dqs, *(sink(d, f"{tag}{i}") for i, d in enumerate(dqs)))


def test_dequantizes_are_judged_all_at_once_and_a_broken_one_refused():
    good = dequantized()
    assert proven(good + dequantized("b"))
    odd = [TensorSpec((2, 3), torch.bfloat16)] * 15 + [TensorSpec((3, 2), torch.bfloat16)]
    for broken in (dequantized("b", shapes=odd), dequantized("b", dtype=torch.float16)):
        assert not proven(good + broken)
        assert "dequantize keeps the shape" in check(PlanGraph(good + broken))[0]


def packed(tag="p", count=12, dtype=torch.bfloat16, extra=None):
    """``count`` int4 weights (packed words and group scales) dequantized into their
    logical ``[2, 3]``, each sunk; ``extra``: the index of one fed a third input."""
    scheme = Scheme("int", group=2)
    words, grid = TensorSpec((2, 1), torch.int32), TensorSpec((2, 2), torch.bfloat16)
    attrs = DequantizeAttrs(dtype, (), scheme)
    parts = [[Node(NodeKind.READ, spec, (), ReadAttrs(entry(f"{tag}{r}{i}", spec.shape, 8 * i,
                                                            spec.dtype), (r, i)))
              for i in range(count)] for r, spec in enumerate((words, grid))]
    dqs = [Node(NodeKind.DEQUANTIZE, TensorSpec((2, 3), torch.bfloat16),
                (w, s, s) if i == extra else (w, s), attrs)
           for i, (w, s) in enumerate(zip(*parts, strict=True))]
    return (*parts[0], *parts[1], *dqs, *(sink(d, f"{tag}{i}") for i, d in enumerate(dqs)))


def test_packed_dequantizes_are_judged_in_columns_and_a_broken_one_refused():
    """A packed dequantize yields its logical shape from its parts: sound when it takes
    as many inputs as its scheme has parts and yields its attrs' dtype, beside FP8 ones."""
    good = dequantized() + packed()
    assert proven(good)
    for broken in (packed("q", dtype=torch.float16), packed("q", extra=5)):
        assert not proven(good + broken)
        assert graph_problems(PlanGraph(good + broken))


def _sound_nodes() -> tuple[Node, ...]:
    convs, _, _ = stacks(3)
    return plan_graph(convs).nodes + dequantized("d", count=4) + packed("p", count=4)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_proof_and_the_per_node_pass_agree(data):
    """Whatever is done to a sound graph's node list (a node dropped, moved, repeated, or
    an input swapped for another node), the proof vouches only for lists the per-node
    pass finds sound, and refuses every list it finds broken."""
    nodes = _sound_nodes()
    i = data.draw(st.integers(0, len(nodes) - 1))
    j = data.draw(st.integers(0, len(nodes) - 1))
    how = data.draw(st.sampled_from(["drop", "move", "repeat", "rewire", "none"]))
    nodes = list(mutated(nodes, i, j, how))
    problems = graph_problems(PlanGraph(tuple(nodes)))
    assert proven(nodes) or problems or how != "none"
    if problems:
        assert graph_holds(tuple(nodes)) is None
