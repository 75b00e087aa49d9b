"""Property tests of the graph inversion itself (``planner/write/invert.py``), on random op
chains built straight into a group (no mapping, no routing):

- inverting a conversion's record and inverting the inverse's record gives back the very
  nodes of the conversion (reads, resolved ops, sinks): the inverse of the inverse is it;
- running the inverse after the conversion gives back every source, bit for bit.
"""

import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from weightplan.errors import OpError
from weightplan.executor.dict_sink import DictSink
from weightplan.executor.run import run_plan
from weightplan.ops import (
    Chunk, Concatenate, MergeModulelist, PermuteForRope, SplitModulelist, Transpose,
)
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.keys.routing import Group, Route
from weightplan.planner.pipelines.convert import MemoryPlan, plan_in_memory
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.write.record import record_of_conversions
from weightplan.planner.write.reverse import ReverseGroups, record_groups

from tests.test_reversibility import random_bits, same_bits

DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn]
State = list[tuple[int, tuple[int, ...]]]  # per stream: (tensors, their shape)


def _transpose(draw, state: State):
    ndim = min(len(s) for _, s in state)
    if ndim < 2:
        return None
    a, b = draw(st.lists(st.integers(0, ndim - 1), min_size=2, max_size=2, unique=True))

    def swapped(s):
        s = list(s)
        s[a], s[b] = s[b], s[a]
        return tuple(s)
    return Transpose(a, b), [(n, swapped(s)) for n, s in state]


def _rope(draw, state: State):
    head = draw(st.sampled_from([2, 4]))
    if any(s[0] % head for _, s in state):
        return None
    return PermuteForRope(head_dim=head), state


def _merge(draw, state: State):
    d = draw(st.integers(0, min(len(s) for _, s in state)))
    return MergeModulelist(d), [(1, s[:d] + (n,) + s[d:]) for n, s in state]


def _split(draw, state: State):
    ndim = min(len(s) for _, s in state)
    if ndim < 2 or any(n != 1 for n, _ in state):
        return None
    d = draw(st.integers(0, ndim - 1))
    return SplitModulelist(d), [(s[d], s[:d] + s[d + 1:]) for _, s in state]


def _concatenate(draw, state: State):
    # over single tensors (an index list concatenated has no Chunk inverse), two or more
    # (the inverse of one tensor's Concatenate, a one-piece Chunk, is refused before the
    # last stage: a Chunk's pieces are checked against the outputs)
    first = state[0][1]
    if len(state) < 2 or any(n != 1 or len(s) != len(first) for n, s in state):
        return None
    dims = [d for d in range(len(first))
            if all(s[:d] + s[d + 1:] == first[:d] + first[d + 1:] for _, s in state)]
    if not dims:
        return None
    d = draw(st.sampled_from(dims))
    return Concatenate(d), [(1, first[:d] + (sum(s[d] for _, s in state),) + first[d + 1:])]


def _chunk(draw, state: State):
    if len(state) != 1 or state[0][0] != 1:
        return None
    shape = state[0][1]
    d = draw(st.integers(0, len(shape) - 1))
    if shape[d] < 2:
        return None
    cuts = sorted(draw(st.sets(st.integers(1, shape[d] - 1), min_size=1)))
    sizes = tuple(b - a for a, b in zip([0, *cuts], [*cuts, shape[d]], strict=True))
    return Chunk(d, sizes=sizes), [(1, shape[:d] + (n,) + shape[d + 1:]) for n in sizes]


MAKERS = [_transpose, _rope, _merge, _split, _concatenate, _chunk]


@st.composite
def chains(draw):
    """Sources (key → tensor, per stream), an op chain, and the output keys per stream."""
    streams, count = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3)))
    dtype, seed = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**16))
    state: State = [(count, shape)] * streams
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        made = draw(st.sampled_from(MAKERS))(draw, state)
        if made is not None:
            ops.append(made[0])
            state = made[1]
    assume(ops)
    sources = [[(f"src{i}.{j}", random_bits(shape, dtype, seed + 10 * i + j))
                for j in range(count)] for i in range(streams)]
    outputs = tuple(tuple(f"out{i}.{j}" for j in range(n)) for i, (n, _) in enumerate(state))
    return sources, tuple(ops), outputs


def _planned(sources, ops, outputs) -> MemoryPlan:
    ckpt = open_checkpoint({k: v for stream in sources for k, v in stream})
    entries = tuple(tuple(ckpt.entries[k] for k, _ in stream) for stream in sources)
    routes = tuple(tuple(Route(e.key, e.key, ()) for e in stream) for stream in entries)
    group = Group(None, entries, routes, tuple(s[0] for s in outputs), outputs, operations=ops)
    try:
        return plan_in_memory(ReverseGroups((group,), None, ()), ckpt)
    except OpError:  # a chain the ops refuse forward (a Chunk whose pieces aren't the outputs)
        assume(False)
        raise


def _inverse(plan: MemoryPlan, tensors: dict[str, torch.Tensor]) -> MemoryPlan:
    """The plan that reads ``plan``'s outputs (``tensors``) back into its sources."""
    record = record_of_conversions(plan.conversions, plan.checkpoint)
    return plan_in_memory(record_groups(record, open_checkpoint(tensors)), open_checkpoint(tensors))


def _run(plan: MemoryPlan) -> dict[str, torch.Tensor]:
    sink = DictSink()
    run_plan(plan.schedule, plan.checkpoint, sink, progress=False, description="inverting")
    return sink.results


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.filter_too_much])
@given(chains())
def test_the_inverse_of_the_inverse_is_the_conversion(chain):
    sources, ops, outputs = chain
    forward = _planned(sources, ops, outputs)
    out = _run(forward)
    backward = _inverse(forward, out)
    [conv], [back] = forward.conversions, backward.conversions
    assert len(back.ops) == len(conv.ops)
    assert all(type(b) is type(op.inverse()) for b, op in zip(back.ops, reversed(conv.ops),
                                                              strict=True))
    assert {n.attrs.entry.key for n in back.nodes if n.kind is NodeKind.READ} == set(out)
    again = _inverse(backward, {k: v for stream in sources for k, v in stream})
    [twice] = again.conversions
    assert twice.ops == conv.ops
    assert twice.nodes == conv.nodes  # reads, resolved ops, wiring, sinks: the same graph


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.filter_too_much])
@given(chains())
def test_the_inverse_gives_back_every_source_bit_for_bit(chain):
    sources, ops, outputs = chain
    forward = _planned(sources, ops, outputs)
    out = _run(forward)
    assert set(out) == {k for stream in outputs for k in stream}
    back = _run(_inverse(forward, out))
    originals = {k: v for stream in sources for k, v in stream}
    assert set(back) == set(originals)
    assert all(same_bits(back[k], originals[k]) for k in originals)
