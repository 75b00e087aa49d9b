"""Placement by hand: exact byte ranges, pieces and landing views (no explain())."""

from collections import Counter

import torch

from weightplan.ops import Chunk, Concatenate, MergeModulelist, Transpose
from weightplan.planner.core.geometry import Region, View
from weightplan.planner.tensors.lower.placement import plan_step

from tests.conftest import Doubler
from tests.planner.core import DATA_START, conversion, entry


def test_a_merge_reads_each_expert_straight_into_its_slice():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(3)]
    step = plan_step(conversion([experts], ["w"], [MergeModulelist(0)]))
    assert [d.key for d in step.destinations] == ["w"]
    assert step.destinations[0].spec.shape == (3, 2, 3)
    assert [r.byte_range for r in step.reads] == [(DATA_START + 24 * i, 24) for i in range(3)]
    assert [r.fragment.view for r in step.reads] == [
        View((2, 3), (3, 1), 6 * i) for i in range(3)]
    assert all(r.direct and r.pieces == ((0, 24),) for r in step.reads)
    assert not step.materialize and step.held_bytes == 0 and step.dest_bytes == 72


def test_a_large_direct_read_is_split_into_pieces():
    whole = entry("w", (64,), 0)  # 256 bytes
    step = plan_step(conversion([[whole]], ["w"]), piece_bytes=100)
    (read,) = step.reads
    assert read.byte_range == (DATA_START, 256)
    assert read.pieces == ((0, 100), (100, 100), (200, 56))
    assert step.window_counts() == Counter({100: 1})


def test_a_strided_read_is_not_split():
    a, b = entry("a", (2, 2), 0), entry("b", (2, 2), 16)
    step = plan_step(conversion([[a], [b]], ["ab"], [Concatenate(1)]), piece_bytes=4)
    assert [r.fragment.view for r in step.reads] == [View((2, 2), (4, 1), 0),
                                                      View((2, 2), (4, 1), 2)]
    assert not any(r.direct for r in step.reads)
    assert [r.pieces for r in step.reads] == [((0, 16),), ((0, 16),)]


def test_a_chunk_reads_only_each_targets_rows():
    qk = entry("qk", (4, 3), 8)
    step = plan_step(conversion([[qk]], ["q", "k"], [Chunk(0)]))
    assert [(r.fragment.target, r.byte_range, r.region) for r in step.reads] == [
        (0, (DATA_START + 8, 24), Region((0, 0), (2, 3))),
        (1, (DATA_START + 32, 24), Region((2, 0), (4, 3)))]
    assert all(r.direct for r in step.reads)


def test_an_op_that_cannot_place_runs_materialized():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(2)]
    step = plan_step(conversion([experts], ["w"], [Doubler(), MergeModulelist(0)]))
    assert [type(op) for op in step.ops] == [Doubler]
    assert all(r.fragment is None and r.region == Region.full((2, 3)) for r in step.reads)
    assert step.held_bytes == 48 and step.convert_bytes == 48
    # the doubled experts land in their slices of the merged tensor
    assert [f.view.offset for frags in step.outputs[0] for f in frags] == [0, 6]


def test_transpose_lands_through_a_strided_view():
    w = entry("w", (2, 3), 0)
    step = plan_step(conversion([[w]], ["t"], [Transpose(0, 1)]))
    (read,) = step.reads
    assert read.fragment.view == View((2, 3), (1, 2), 0) and not read.direct
    assert step.destinations[0].spec.shape == (3, 2)


def test_a_cast_is_never_a_byte_copy():
    from weightplan.planner.keys.routing import Group, Route
    from weightplan.planner.tensors.ir.build import SinkKind, build_conversion

    w = entry("w", (4,), 0, torch.bfloat16)
    group = Group(None, ((w,),), ((Route("w", "w", ()),),), ("w",))
    step = plan_step(build_conversion(group, None, torch.float32, SinkKind.MEMORY))
    assert step.destinations[0].spec.dtype == torch.float32
    assert not step.reads[0].direct and step.reads[0].byte_range == (DATA_START, 8)


def test_a_shard_reads_only_its_region_through_the_ops():
    """What the tensor-parallel work builds on: a shard node between the ops and the sink
    narrows the fragment, and the ops push it down to the reads."""
    import dataclasses

    from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ShardAttrs, SinkAttrs
    from weightplan.planner.core.sharding.placements import Placement
    from weightplan.planner.core.spec import TensorSpec

    a, b = entry("a", (2, 3), 0), entry("b", (2, 3), 24)
    conv = conversion([[a], [b]], ["ab"], [Concatenate(0)])
    (sink,) = conv.sinks
    rows = Region((2, 0), (4, 3))  # rank 1 of 2, along dim 0: all of b, none of a
    shard = Node(NodeKind.SHARD, TensorSpec((2, 3), torch.float32), sink.inputs,
                 ShardAttrs(Placement.shard(0), (rows,), 1, 2))
    dest = dataclasses.replace(sink.attrs.dest, spec=shard.spec, stride=(3, 1))
    local = Node(NodeKind.SINK, shard.spec, (shard,), SinkAttrs(dest))
    nodes = tuple(n for n in conv.nodes if n is not sink) + (shard, local)
    step = plan_step(dataclasses.replace(conv, nodes=nodes))
    (read,) = step.reads
    assert read.entry.key == "b" and read.byte_range == (DATA_START + 24, 24) and read.direct
    assert read.fragment.view == View((2, 3), (3, 1), 0)


def test_the_experts_of_a_stack_share_one_layout_region_and_view_shape():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(4)]
    step = plan_step(conversion([experts], ["w"], [MergeModulelist(0)]))
    assert len({id(r.layout) for r in step.reads}) == 1  # one ReadLayout for every expert
    assert len({id(r.region) for r in step.reads}) == 1
    assert len({id(r.fragment.view.shape) for r in step.reads}) == 1
    # the same fragments View.select and Region.drop would have built
    whole = View((4, 2, 3), (6, 3, 1))
    assert [r.fragment.view for r in step.reads] == [whole.select(0, i) for i in range(4)]
    assert [r.region for r in step.reads] == [Region((0, 0, 0), (4, 2, 3)).drop(0)] * 4


def test_a_layout_is_what_the_read_covers():
    qk = entry("qk", (4, 3), 8)
    step = plan_step(conversion([[qk]], ["q", "k"], [Chunk(0)]))
    first, second = (r.layout for r in step.reads)
    assert (first.first, first.length, second.first, second.length) == (0, 24, 24, 24)
    assert step.read_bytes == 48 and step.window_counts() == Counter({24: 2})
