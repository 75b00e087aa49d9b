"""A plain key's conversion (one read, a cast at most, one sink) is lowered by
``lone_step`` without its stages: the step is the one the stages give it
(``staged_step``), and anything else that looks like one is left to them."""

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.keys.routing import Group, Route
from weightplan.planner.tensors.ir.build import SinkKind, build_conversion
from weightplan.planner.tensors.ir.destination import DestKind
from weightplan.planner.tensors.ir.nodes import Node, NodeKind
from weightplan.planner.tensors.lower.placement import lone_step, plan_step, staged_step

from tests.planner.core import FILE, entry

_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8])


def _plain(shape, dtype, cast, in_file, sink):
    e = entry("a.w", shape, 8, dtype)
    if not in_file:
        e = TensorEntry(e.key, e.spec, None, 0)
    group = Group(None, ((e,),), ((Route(e.key, e.key, ()),),), (e.key,))
    return build_conversion(group, None, cast, sink)


def _staged(conv):
    return staged_step(conv, [n.kind for n in conv.nodes])


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple), dtype=_DTYPES,
       cast=st.one_of(st.none(), _DTYPES), in_file=st.booleans(),
       sink=st.sampled_from([SinkKind.MEMORY, SinkKind.MODEL, SinkKind.FILE]),
       piece=st.sampled_from([8, 64, 4 << 20]))
def test_lone_step_is_the_staged_step(shape, dtype, cast, in_file, sink, piece):
    conv = _plain(shape, dtype, cast, in_file, sink)
    kinds = [n.kind for n in conv.nodes]
    assert kinds[0] is NodeKind.READ and kinds[-1] is NodeKind.SINK and len(kinds) <= 3
    lone = lone_step(conv, piece)
    assert lone is not None
    assert lone == staged_step(conv, kinds, piece) == plan_step(conv, piece)
    assert lone.sources == ((conv.nodes[0],),) and lone.sinks == (conv.nodes[-1],)


def test_a_discarded_sink_or_another_source_is_left_to_the_stages():
    conv = _plain((2, 3), torch.float32, None, True, SinkKind.MEMORY)
    read, sink = conv.nodes
    dest = dataclasses.replace(sink.attrs.dest, kind=DestKind.DISCARD)
    discarded = dataclasses.replace(
        conv, nodes=(read, Node(NodeKind.SINK, sink.spec, sink.inputs,
                                dataclasses.replace(sink.attrs, dest=dest))))
    assert lone_step(discarded) is None
    assert plan_step(discarded) == _staged(discarded)
    other = entry("b.w", (2, 3), 64)
    fed = Node(NodeKind.SINK, sink.spec, (Node(NodeKind.READ, read.spec, (), dataclasses.replace(
        read.attrs, entry=other)),), sink.attrs)
    assert lone_step(dataclasses.replace(conv, nodes=(read, fed))) is None
    assert FILE == read.attrs.entry.file
