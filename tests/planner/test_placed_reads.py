"""A step's read tasks: one algorithm (``placed_reads``), a stack's stream made in columns
and any other read by read, always the tasks ``read_task`` makes for each non-empty
fragment each node lands in. Stages are read back from the nodes alone."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.errors import PlanError
from weightplan.ops import Concatenate, MergeModulelist
from weightplan.planner.core.entry import StridedEntry
from weightplan.planner.core.geometry import (
    Fragment, Region, StackFragments, View, stack_fragments,
)
from weightplan.planner.core.quant.formats import Scheme, companion_shapes
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.ir.build import stages
from weightplan.planner.tensors.ir.destination import Destination, DestKind
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind, ReadAttrs
from weightplan.planner.tensors.lower import read_tasks as placed_module
from weightplan.planner.tensors.lower.placement import Step, plan_step
from weightplan.planner.tensors.lower.read_tasks import placed_reads
from weightplan.planner.tensors.lower.read_tasks import read_task
from weightplan.planner.tensors.schedule.schedule import order_steps
from tests.planner.core import FILE, conversion, entry

FP8, BF16, F32 = torch.float8_e4m3fn, torch.bfloat16, torch.float32
SHAPE = (4, 6)
ODD = ("spec", "dtype", "memory", "strided", "scale", "block", "kind", "no fragment",
       "two fragments", "empty", "region", "shifted", "view", "target")


def _reference(stream, frags, dests, piece_bytes):
    """Each non-empty fragment of each node, as :func:`read_task` makes it (direct: a plain
    byte copy is possible)."""
    out = []
    for node, placed in zip(stream, frags, strict=True):
        e = (node.inputs[0] if node.kind is NodeKind.DEQUANTIZE else node).attrs.entry
        for f in placed:
            if f.region.numel == 0:
                continue
            direct = (e.contiguous and f.view.is_contiguous()
                      and f.region.element_span(e.spec.shape)[1] == f.region.numel
                      and dests[f.target].spec.dtype == e.spec.dtype)
            out.append(read_task(node, f.region, f, direct, piece_bytes))
    return tuple(out)


def _packed(j: int, odd: str | None, memory: bool) -> Node:
    """An int4 pack-quantized weight of logical ``SHAPE`` (or ``[6, 4]``): its packed
    words and group scales (a scale of another dtype, another group: ``odd``)."""
    shape = (6, 4) if odd == "spec" else SHAPE
    scheme = Scheme("int", group=3 if odd in ("scale", "block") else 2)
    file = None if memory or odd in ("memory", "strided") else FILE
    parts = companion_shapes(scheme, shape)
    reads = tuple(
        Node(NodeKind.READ, spec, (), ReadAttrs(TensorEntry(f"{role}.{j}", spec, file,
                                                            1000 + 100 * j + 50 * r), (0, j)))
        for r, role in enumerate(scheme.roles)
        for spec in [TensorSpec(parts[role], torch.int32 if role == "packed"
                                else F32 if odd == "dtype" else BF16)])
    if odd == "kind":
        return reads[0]
    return Node(NodeKind.DEQUANTIZE, TensorSpec(shape, BF16), reads,
                DequantizeAttrs(BF16, (), scheme))


def _node(j: int, dequantize: bool | str, odd: str | None, memory: bool = False) -> Node:
    if dequantize == "packed":
        return _packed(j, odd, memory)
    dtype = F32 if odd == "dtype" else (FP8 if dequantize else BF16)
    shape = (6, 4) if odd == "spec" else SHAPE
    file = None if memory or odd in ("memory", "strided") else FILE
    spec = TensorSpec(shape, dtype)
    e = (StridedEntry(f"e.{j}", spec, None, 0, contiguous=False) if odd == "strided"
         else TensorEntry(f"e.{j}", spec, file, 1000 + 100 * j if file else 0))
    read = Node(NodeKind.READ, spec, (), ReadAttrs(e, (0, j)))
    if not dequantize or odd == "kind":
        return read
    block = (4, 6) if odd == "block" else (2, 6)
    grid = TensorSpec((1, 1) if odd == "block" else (2, 1), BF16 if odd == "scale" else F32)
    scale = Node(NodeKind.READ, grid, (), ReadAttrs(TensorEntry(f"s.{j}", grid, FILE, 50 + j),
                                                    (0, j)))
    return Node(NodeKind.DEQUANTIZE, TensorSpec(shape, BF16), (read, scale),
                DequantizeAttrs(BF16, block))


def _fragments(j: int, odd: str | None, half: bool = False) -> tuple[Fragment, ...]:
    full, offset = Region.full(SHAPE), 24 * j
    if half or odd == "shifted":  # the top half (the bottom one: shifted)
        top = 2 if odd == "shifted" else 0
        return (Fragment(Region((top, 0), (top + 2, 6)), 0, View((2, 6), (6, 1), offset)),)
    if odd == "no fragment":
        return ()
    if odd == "two fragments":
        return tuple(Fragment(Region((r, 0), (r + 2, 6)), 0, View((2, 6), (6, 1), offset + 6 * r))
                     for r in (0, 2))
    if odd == "empty":
        return (Fragment(Region((0, 0), (0, 6)), 0, View((0, 6), (6, 1), offset)),)
    if odd == "region":
        return (Fragment(Region((1, 0), (3, 6)), 0, View((2, 6), (6, 1), offset)),)
    if odd == "view":
        return (Fragment(full, 0, View(SHAPE, (1, 4), offset)),)
    return (Fragment(full, 1 if odd == "target" else 0, View(SHAPE, (6, 1), offset)),)


@st.composite
def _streams(draw):
    """A stream of reads, FP8 or packed dequantizes and where each lands: all alike (a
    stack, in a file or in memory, its fragments whole or halves, one by one or as
    :class:`StackFragments`) but for up to two odd items."""
    n = draw(st.sampled_from([10, 8, 12, 1, 3, 7]))  # stacks (8 and more) first
    dequantize = draw(st.sampled_from([False, True, "packed"]))
    odd = {draw(st.integers(0, n - 1)): draw(st.sampled_from(ODD))
           for _ in range(draw(st.sampled_from([1, 0, 2])))}
    memory, half = draw(st.booleans()), draw(st.booleans())  # every entry, every fragment
    stream = tuple(_node(j, dequantize, odd.get(j), memory) for j in range(n))
    frags = tuple(_fragments(j, odd.get(j), half) for j in range(n))
    if not half and draw(st.booleans()) and not any(o in ODD[7:] for o in odd.values()):
        first, count = 0, n  # (the whole stack, or a run of it: a rank's experts)
        if draw(st.booleans()):
            first = draw(st.integers(0, n))
            count = draw(st.integers(0, n - first))
        frags = stack_fragments(Region.full(SHAPE), 0, SHAPE, (6, 1), 24 * first, 24, count,
                                first, n)
    return stream, frags, draw(st.sampled_from([1 << 25, 16]))


DESTS = tuple(Destination(f"d{t}", (f"d{t}",), TensorSpec((12, *SHAPE), dtype), DestKind.MEMORY,
                          (24, 6, 1)) for t, dtype in enumerate((BF16, F32)))


@settings(max_examples=300, deadline=None)
@given(_streams())
def test_placed_reads_are_each_fragments_read_task(case):
    stream, frags, piece_bytes = case
    made = placed_reads((stream,), (frags,), DESTS, piece_bytes)
    assert made == _reference(stream, frags, DESTS, piece_bytes)
    assert all(t.entry is (t.read.attrs.entry) for t in made)


@pytest.mark.parametrize("dequantize", [False, True, "packed"])
@pytest.mark.parametrize("stacked", [False, True])
def test_a_stack_is_made_in_columns_and_an_odd_stream_read_by_read(monkeypatch, dequantize,
                                                                    stacked):
    n = 10
    stream = tuple(_node(j, dequantize, None) for j in range(n))
    frags = (stack_fragments(Region.full(SHAPE), 0, SHAPE, (6, 1), 0, 24, n) if stacked
             else tuple(_fragments(j, None) for j in range(n)))
    odd = (*stream[:-1], _node(n - 1, dequantize, "memory"))
    each = placed_module._each_read
    calls = []
    monkeypatch.setattr(placed_module, "_each_read", lambda *a: calls.append(a) or each(*a))
    columns = placed_reads((stream,), (frags,), DESTS, 1 << 25)
    assert not calls and len({id(t.layout) for t in columns}) == 1
    assert placed_reads((odd,), (frags,), DESTS, 1 << 25) == _reference(odd, frags, DESTS, 1 << 25)
    assert len(calls) == 1


def test_one_fragment_over_a_run_of_a_stack_places_as_one_stack_of_the_run():
    """A rank's experts (items 2 to 5 of 8) land as a :class:`StackFragments` of the run,
    the other items nowhere; the run read alone is a stack of its own."""
    f = Fragment(Region((2, 0, 0), (5, *SHAPE)), 0, View((3, *SHAPE), (24, 6, 1), 0))
    placed = MergeModulelist(0).place((((f,),),), ((TensorSpec(SHAPE, BF16),) * 8,))[0]
    items = [(Fragment(Region.full(SHAPE), 0, View(SHAPE, (6, 1), 24 * (k - 2))),)
             if 2 <= k < 5 else () for k in range(8)]
    assert isinstance(placed, StackFragments) and placed.first == 2
    assert placed == tuple(items)
    run = placed.landing()
    assert isinstance(run, StackFragments) and run == tuple(items[2:5]) and run.first == 0
    stream = tuple(_node(j, False, None) for j in range(8))
    assert placed_reads((stream,), (placed,), DESTS, 1 << 25) == \
        _reference(stream, tuple(items), DESTS, 1 << 25)


def _step(*streams) -> Step:
    return plan_step(conversion([list(s) for s in streams], ["w"],
                                [MergeModulelist(0)] + ([Concatenate(1)] if len(streams) > 1
                                                        else [])))


def test_the_order_takes_each_steps_smallest_file_rank_and_first_byte():
    def experts(files, base):
        return [TensorEntry(f"e.{base}.{i}", TensorSpec((2, 3), F32), files[i % len(files)],
                            base + 1000 - 7 * i) for i in range(10)]

    rank = {"a": 0, "b": 1, "c": 2}
    steps = [_step(experts(files, base)) for files, base in (
        (["b", "a"], 0), (["c"], 10), ([None], 20), (["z"], 30), (["a", "b", "c"], 40),
        (["a", "b"], 50))]

    def key(step):  # read by read
        return min((rank.get(r.entry.file, -1), r.byte_range[0]) for r in step.reads)

    assert [key(s) for s in steps] == [(0, 937), (2, 947), (-1, 957), (-1, 967), (0, 977), (0, 994)]
    assert order_steps(steps, ["a", "b", "c"]) == tuple(sorted(steps, key=key))


def test_steps_of_equal_keys_keep_their_order():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(10)]
    a, b = _step(experts), _step(experts)
    assert order_steps([a, b], [FILE]) == (a, b) and order_steps([b, a], [FILE]) == (b, a)


def test_byte_counts_are_the_reads_sums():
    gate = [entry(f"e.{i}.g", (2, 3), 24 * i) for i in range(10)]
    up = [entry(f"e.{i}.u", (2, 3), 24 * (10 + i)) for i in range(10)]
    up[2] = TensorEntry("e.2.u", up[2].spec, None, 0)  # in memory: read by read
    step = _step(gate, up)
    assert step.read_bytes == sum(r.nbytes + r.scale_bytes for r in step.reads) == 20 * 24
    assert step.window_counts() == {24: 19} and step.held_bytes == 0


def test_stages_with_a_gap_are_a_plan_error():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(10)]
    conv = conversion([experts], ["w"], [MergeModulelist(0)])
    assert stages(conv) == ((tuple(n for n in conv.nodes if n.kind is NodeKind.READ),),
                            (tuple(n for n in conv.nodes if n.kind is NodeKind.OP),))
    gap = dataclasses.replace(conv, nodes=tuple(n for n in conv.nodes
                                                 if n.attrs.__class__ is not ReadAttrs
                                                 or n.attrs.source != (0, 3)))
    with pytest.raises(PlanError, match=r"stage 0 .* no node at \(0, 3\)"):
        stages(gap)
