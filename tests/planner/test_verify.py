"""``verify`` by hand: every invariant it checks, broken once, named in its message."""

import dataclasses

import pytest
import torch

from weightplan.planner.core.sharding.placements import Placement

from weightplan.errors import GraphError
from weightplan.ops import Chunk, MergeModulelist
from weightplan.planner.inputs.checkpoint import FileStamp
from weightplan.planner.tensors.ir.destination import Destination, DestKind
from weightplan.planner.core.geometry import Region
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.nodes import (
    CastAttrs, Node, NodeKind, ReadAttrs, ShardAttrs, SinkAttrs,
)
from weightplan.planner.tensors.lower.placement import plan_step, read_task
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.verify.verify import check, verify

from tests.planner.core import FILE, checkpoint, conversion, entry

F32 = TensorSpec((2, 3), torch.float32)


def read_node(key="w", offset=0):
    return Node(NodeKind.READ, F32, (), ReadAttrs(entry(key, (2, 3), offset), (0, 0)))


def sink(value, key="w"):
    dest = Destination(key, (key,), value.spec, DestKind.MEMORY, (3, 1))
    return Node(NodeKind.SINK, value.spec, (value,), SinkAttrs(dest))


def merged():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(3)]
    conv = conversion([experts], ["w"], [MergeModulelist(0)])
    return conv, plan_step(conv), checkpoint(*experts)


def test_a_sound_plan_has_no_problems():
    conv, step, ckpt = merged()
    assert check(plan_graph([conv]), [step], ckpt) == []


def test_an_input_after_its_consumer_is_a_cycle():
    r = read_node()
    assert "later in the graph" in check(PlanGraph((sink(r), r)))[0]


def test_a_dangling_input():
    (problem,) = check(PlanGraph((sink(read_node()),)))
    assert "not in the graph" in problem and "<read w f32[2, 3]>" in problem


def test_wrong_attrs_for_the_kind():
    r = read_node()
    bad = Node(NodeKind.CAST, F32, (r,), ReadAttrs(r.attrs.entry, (0, 0)))
    assert "needs CastAttrs" in check(PlanGraph((r, bad, sink(bad))))[0]


def test_wrong_arity():
    a, b = read_node("a"), read_node("b", 24)
    two = dataclasses.replace(sink(a), inputs=(a, b))
    assert "takes 1 input(s), has 2" in check(PlanGraph((a, b, two)))[0]


def test_a_cast_that_changes_the_shape():
    r = read_node()
    cast = Node(NodeKind.CAST, TensorSpec((3, 2), torch.float16), (r,), CastAttrs(torch.float16))
    assert "a cast keeps the shape" in check(PlanGraph((r, cast, sink(cast))))[0]


def test_a_sink_whose_input_has_another_dtype():
    r = read_node()
    wrong = dataclasses.replace(sink(r), spec=TensorSpec((2, 3), torch.float16))
    assert "insert a cast node" in check(PlanGraph((r, wrong)))[0]


def test_a_shard_yields_its_pieces():
    r = read_node()
    attrs = ShardAttrs(Placement.shard(0), (Region((0, 0), (1, 3)),), 0, 2)
    shard = Node(NodeKind.SHARD, F32, (r,), attrs)
    assert "a shard yields its pieces [1, 3]" in check(PlanGraph((r, shard, sink(shard))))[0]
    outside = ShardAttrs(Placement.shard(0), (Region((1, 0), (3, 3)),), 1, 2)
    wrong = Node(NodeKind.SHARD, TensorSpec((2, 3), torch.float32), (r,), outside)
    assert "inside the input [2, 3]" in check(PlanGraph((r, wrong, sink(wrong))))[0]


def test_two_producers_of_one_tensor():
    a, b = read_node("a"), read_node("b", 24)
    problems = check(PlanGraph((a, b, sink(a, "w"), sink(b, "w"))))
    assert "also comes from" in problems[0] and "keep one producer" in problems[0]


def test_an_intermediate_without_consumer():
    r, lonely = read_node(), read_node("x", 24)
    (problem,) = check(PlanGraph((r, lonely, sink(r))))
    assert "<read x f32[2, 3]> has no consumer" in problem


def test_a_destination_left_partly_unwritten():
    conv, step, ckpt = merged()
    short = dataclasses.replace(step, reads=step.reads[:2])
    (problem,) = check(plan_graph([conv]), [short], ckpt)
    assert "destination w" in problem and "cover 12 of its 18 elements" in problem


def test_a_destination_written_twice():
    conv, step, ckpt = merged()
    twice = dataclasses.replace(step, reads=(step.reads[0], step.reads[0], step.reads[1]))
    (problem,) = check(plan_graph([conv]), [twice], ckpt)
    assert "two fragments both write element offset 0" in problem


def test_a_read_outside_the_data_section():
    conv, step, ckpt = merged()
    (stamp,) = ckpt.files
    moved = dataclasses.replace(ckpt, files=(FileStamp(FILE, stamp.size, 0, data_start=stamp.data_start + 30),))
    problems = check(plan_graph([conv]), [step], moved)
    assert len(problems) == 2  # e.0 and e.1 start before the (moved) data section
    assert "read of e.0.w [64, 88) leaves the data section [94, 136)" in problems[0]


def test_a_read_outside_its_tensor():
    qk = entry("qk", (4, 3), 0)
    conv = conversion([[qk]], ["q", "k"], [Chunk(0)])
    step = plan_step(conv)
    frag = step.reads[1].fragment
    past = read_task(step.reads[1].node, Region((2, 0), (5, 3)), frag, True)
    problems = check(plan_graph([conv]), [dataclasses.replace(step, reads=(step.reads[0], past))])
    assert any("leaves the tensor's bytes" in p for p in problems)


def test_a_node_run_by_two_steps():
    conv, step, ckpt = merged()
    problems = check(plan_graph([conv]), [step, step], ckpt)
    assert any("run by steps 1 and 2" in p for p in problems)


def test_verify_raises_one_error_listing_every_problem():
    a, b = read_node("a"), read_node("b", 24)
    with pytest.raises(GraphError) as info:
        verify(PlanGraph((a, b, sink(a, "w"), sink(b, "w"), read_node("x", 48))))
    assert len(info.value.problems) == 2 and "2 problem(s)" in str(info.value)


def test_every_step_is_submitted_then_finalized_once():
    from weightplan.planner.tensors.schedule.schedule import Event, EventKind
    from weightplan.planner.tensors.verify.verify import check_events

    s, f = EventKind.SUBMIT, EventKind.FINALIZE
    assert check_events(2, [Event(s, 0), Event(s, 1), Event(f, 0), Event(f, 1)]) == []
    (early,) = check_events(1, [Event(f, 0), Event(s, 0)])[:1]
    assert "step 1 is finalized before it is submitted" in early
    assert "never finalized" in check_events(2, [Event(s, 0), Event(f, 0), Event(s, 1)])[0]
    assert "submitted twice" in check_events(1, [Event(s, 0), Event(s, 0), Event(f, 0)])[0]


def test_a_sound_plan_is_proven_a_segment_at_a_time():
    """``graph_holds`` proves a sound plan (the per-node pass only runs to word problems);
    its steps' nodes are found in their segments, and a step run twice is refused."""
    from weightplan.planner.tensors.verify.graph_checks import graph_holds
    from weightplan.planner.tensors.verify.verify import release_holds

    conv, step, _ = merged()
    graph = plan_graph([conv])
    segments = graph_holds(graph.nodes)
    assert segments is not None and segments.ends == [len(graph.nodes)]
    assert release_holds(segments, [step])
    assert not release_holds(segments, [step, step])


def broken_graphs() -> list[tuple[Node, ...]]:
    """Node lists every proof must refuse: a sink before its input, an input outside the
    graph, a cast with read attrs, a sink of two inputs, a cast of the wrong spec, two
    sinks of one key, a read nothing consumes."""
    r, a, b = read_node(), read_node("a"), read_node("b", 24)
    cast = Node(NodeKind.CAST, TensorSpec((3, 2), torch.float16), (r,), CastAttrs(torch.float16))
    return [(sink(r), r), (sink(read_node()),),
            (r, Node(NodeKind.CAST, F32, (r,), ReadAttrs(r.attrs.entry, (0, 0)))),
            (a, b, dataclasses.replace(sink(a), inputs=(a, b))), (r, cast, sink(cast)),
            (a, b, sink(a, "w"), sink(b, "w")), (r, read_node("x", 24), sink(r))]


def test_the_graph_proof_refuses_every_broken_graph():
    from weightplan.planner.tensors.verify.graph_checks import graph_holds

    for nodes in broken_graphs():
        assert graph_holds(nodes) is None, nodes
        assert check(PlanGraph(nodes)), nodes


def test_an_equal_node_that_is_another_object_is_judged_exactly():
    """Identity is stronger than equality: a consumer whose input is an equal copy of an
    earlier node is not proven, and the per-node pass accepts it."""
    from weightplan.planner.tensors.verify.graph_checks import graph_holds

    r = read_node()
    copy = Node(r.kind, r.spec, r.inputs, r.attrs)
    assert copy == r and copy is not r
    assert graph_holds((r, sink(copy))) is None
    assert check(PlanGraph((r, sink(copy)))) == []
