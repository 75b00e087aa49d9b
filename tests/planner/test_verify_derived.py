"""A rank's graph proven from the base every rank shares (``derived``): only the tails a
rank replaced are looked at, the result is the graph and segments the whole check gives,
and whatever is done to a tail, the proof vouches only for graphs the per-node pass finds
sound (a property test)."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.planner.core.geometry import Region, row_major_strides
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.pipelines.lower import Lowered, plan_graph
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ShardAttrs, SinkAttrs
from weightplan.planner.tensors.lower.placement import Fronts, plan_step
from weightplan.planner.tensors.verify.derived import base_of, derived
from weightplan.planner.tensors.verify.graph_checks import graph_holds, graph_problems
from weightplan.planner.tensors.verify.verify import check, release_holds

from tests.planner.graph_mutations import mutated
from tests.planner.test_verify_segments import stacks


def sharded(conv, rank, world=3):
    """``conv`` (three experts merged, one sink) as ``rank`` keeps it: its expert."""
    sink = conv.nodes[-1]
    value = sink.inputs[0]
    box = Region((rank, 0, 0), (rank + 1, *value.spec.shape[1:]))
    attrs = ShardAttrs(Placement.shard(0), (box,), rank, world)
    shard = Node(NodeKind.SHARD, TensorSpec(attrs.local_shape, value.spec.dtype), (value,), attrs)
    dest = dataclasses.replace(sink.attrs.dest, spec=shard.spec,
                               stride=row_major_strides(shard.spec.shape))
    local = Node(NodeKind.SINK, shard.spec, (shard,), SinkAttrs(dest))
    return dataclasses.replace(conv, nodes=conv.nodes[:-1] + (shard, local))


def test_a_rank_graph_is_the_whole_checks_graph():
    convs, _, ckpt = stacks(4)
    base = base_of([c.nodes for c in convs])
    assert base is not None
    for rank in range(3):
        mine = [sharded(c, rank) if k % 2 else c for k, c in enumerate(convs)]
        graph, segments = derived(base, [c.nodes for c in mine])
        whole = plan_graph(mine)
        assert graph == whole and graph.distinct
        assert segments.ends == graph_holds(whole.nodes).ends
        assert segments.proofs[0] == segments.proofs[2] != segments.proofs[1] == segments.proofs[3]
        steps = [plan_step(c) for c in mine]
        assert release_holds(segments, steps, True)
        assert not release_holds(segments, [steps[0], steps[0]], True)
        assert check(graph, steps, ckpt, proven=segments) == [] == check(graph, steps, ckpt)


def test_lowered_proves_each_rank_from_its_base_and_checks_the_rest_whole():
    convs, _, _ = stacks(2)
    memo = Lowered(convs)
    graph, segments = memo.graph([sharded(c, 1) for c in convs])
    assert segments is not None and graph == plan_graph([sharded(c, 1) for c in convs])
    strangers = stacks(3)[0]  # conversions the base doesn't have: checked whole
    graph, segments = memo.graph(strangers)
    assert segments is None and graph == plan_graph(strangers)


def test_ranks_lower_on_the_stages_of_the_front_they_share():
    """A rank's conversion is lowered on the stages of the first conversion of its group
    whose stage nodes are the same objects (its step is the one it lowers to alone); a
    conversion of that group with other stage nodes gets its own."""
    convs, _, _ = stacks(2)
    fronts = Fronts()
    kinds = [n.kind for n in convs[0].nodes]
    shared = fronts.of(convs[0], kinds)
    for rank in range(3):
        for c in convs:
            mine = sharded(c, rank)
            assert plan_step(mine, fronts=fronts) == plan_step(mine)
        assert fronts.of(sharded(convs[0], rank), [n.kind for n in sharded(convs[0], rank).nodes]) \
            is shared
    stranger = dataclasses.replace(convs[1], group=convs[0].group)  # (other nodes, same group)
    own = fronts.of(stranger, [n.kind for n in stranger.nodes])
    assert own is not shared and own[0][0][0][0] is convs[1].nodes[0]
    assert own == fronts.of(stranger, [n.kind for n in stranger.nodes])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_derived_proof_never_vouches_for_a_broken_graph(data):
    """A rank's tail (its shard and sink, or a node before them) dropped, moved, repeated
    or rewired, to a node of its own part or of another: the derived proof vouches only
    for graphs the per-node pass finds sound, and for the unchanged rank graph."""
    convs, _, _ = stacks(3)
    base = base_of([c.nodes for c in convs])
    parts = [sharded(c, k % 3).nodes for k, c in enumerate(convs)]
    k = data.draw(st.integers(0, len(parts) - 1))
    how = data.draw(st.sampled_from(["drop", "move", "repeat", "rewire", "none"]))
    part = parts[k]
    i = data.draw(st.integers(len(part) - 4, len(part) - 1))  # the tail and the op before it
    other = parts[data.draw(st.integers(0, len(parts) - 1))]
    j = data.draw(st.integers(0, len(part) - 1))
    if how == "rewire" and data.draw(st.booleans()):  # an input from another part
        part = part[:i] + (dataclasses.replace(part[i], inputs=(other[j],) + part[i].inputs[1:])
                           if part[i].inputs else part[i],) + part[i + 1:]
    else:
        part = mutated(part, i, j, how)
    parts[k] = part
    shown = derived(base, parts)
    nodes = tuple(n for p in parts for n in p)
    problems = graph_problems(PlanGraph(nodes))
    if shown is not None:
        assert problems == [] and shown[0].nodes == nodes
        assert PlanGraph.of(nodes) == shown[0]
    if how == "none":
        assert shown is not None
    if problems:
        assert shown is None


def test_a_tail_that_writes_a_model_tensor_twice_is_refused():
    """Each tail sound on its own, yet two of them write one model tensor."""
    convs, _, _ = stacks(2)
    base = base_of([c.nodes for c in convs])
    first, second = sharded(convs[0], 0), sharded(convs[1], 0)
    sink = second.nodes[-1]
    twin = Node(NodeKind.SINK, sink.spec, sink.inputs, SinkAttrs(first.nodes[-1].attrs.dest))
    parts = [first.nodes, second.nodes[:-1] + (twin,)]
    assert derived(base, parts) is None
    assert "also comes from" in " ".join(graph_problems(PlanGraph(parts[0] + parts[1])))
