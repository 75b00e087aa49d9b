"""A stack's reads made in columns, from what the build told (``Conversion.built``: the
stages it made, the parts every read of a stream shares; ``StackFragments``: the items'
fragments share region and view shape) are the tasks the exact read-by-read path makes
from the nodes alone; where the build can't vouch, the exact path runs and fails the same."""

import dataclasses
import re

import pytest
import torch

from weightplan import WeightConverter
from weightplan.ops import Chunk, Concatenate, MergeModulelist
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.core.entry import StridedEntry
from weightplan.planner.inputs.fp8_pairs import Fp8Pairing, ScaledWeight
from weightplan.planner.keys.routing import Group, Route
from weightplan.planner.tensors.ir.build import Conversion, SinkKind, build_conversion
from weightplan.planner.core.geometry import Fragment, Region, StackFragments, View
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.tensors.lower.placement import Step, _scan, _scan_nodes, plan_step
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.planner.tensors.ir.alike import alike_reads
from weightplan.planner.tensors.schedule.schedule import _run_first, order_steps
from weightplan.planner.core.spec import TensorSpec

from tests.planner.core import FILE, conversion, entry

FP8 = torch.float8_e4m3fn
N = 10  # experts (alike_reads vouches for 8 or more)


def _exact(conv: Conversion) -> Conversion:
    return dataclasses.replace(conv, built=None)  # the nodes alone


def _assert_same_steps(fast: Step, exact: Step) -> None:
    assert (fast.label, fast.sinks, fast.destinations) == (exact.label, exact.sinks,
                                                           exact.destinations)
    assert (fast.sources, fast.materialize, fast.outputs, fast.quantized) == (
        exact.sources, exact.materialize, exact.outputs, exact.quantized)
    assert len(fast.reads) == len(exact.reads)
    for a, b in zip(fast.reads, exact.reads, strict=True):
        assert a.node is b.node
        assert (a.region, a.fragment, a.layout) == (b.region, b.fragment, b.layout)
        assert (a.byte_range, a.pieces, a.window_bytes, a.scale_bytes) == (
            b.byte_range, b.pieces, b.window_bytes, b.scale_bytes)


def _both(conv: Conversion, piece_bytes: int = 1 << 25) -> Step:
    fast = plan_step(conv, piece_bytes)
    exact = plan_step(_exact(conv), piece_bytes)
    _assert_same_steps(fast, exact)
    assert _scan(conv) == _scan_nodes(conv)
    assert not exact.runs and list(exact.loose_reads) == list(exact.reads)
    assert (fast.read_bytes, fast.window_counts(), fast.held_bytes) == (
        exact.read_bytes, exact.window_counts(), exact.held_bytes)
    files = ["other.safetensors", "f.safetensors", FILE]
    assert order_steps([fast, exact], files) == (fast, exact)  # equal keys: stable
    assert [_first(s, files) for s in order_steps([exact, fast], files)] == [_first(exact, files)] * 2
    return fast


def _first(step: Step, files: list[str]) -> tuple[int, int]:
    """The order's key, read by read."""
    rank = {f: i for i, f in enumerate(files)}
    return min((rank.get(r.entry.file or "", -1), r.byte_range[0]) for r in step.reads)


def _fp8_stack(scale_dtypes: list[torch.dtype], streams: int = 1,
               ops: list | None = None) -> Conversion:
    weights = [[TensorEntry(f"e.{j}.w{s}", TensorSpec((256, 128), FP8), "f.safetensors",
                            100_000 * s + 40_000 * j) for j in range(len(scale_dtypes))]
               for s in range(streams)]
    pairs = {}
    for stream in weights:
        for e, dtype in zip(stream, scale_dtypes, strict=True):
            scale = TensorEntry(e.key + "_scale_inv", TensorSpec((2, 1), dtype), "f.safetensors",
                                e.offset + 32_768)
            pairs[e.key] = ScaledWeight(e, scale, (128, 128))
    quant = QuantContext(Fp8Pairing(pairs, (), frozenset()), None, None)
    routes = tuple(tuple(Route(e.key, e.key, ()) for e in s) for s in weights)
    targets = [f"w{s}" for s in range(streams)] if ops is None or len(ops) == 1 else ["w"]
    converter = WeightConverter([f"e.*.w{s}" for s in range(streams)], targets,
                                ops or [MergeModulelist(0)])
    group = Group(converter, tuple(map(tuple, weights)), routes, tuple(targets))
    return build_conversion(group, None, torch.bfloat16, SinkKind.MEMORY, quant)


def test_a_plain_stack_is_made_in_columns_as_read_by_read():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * (N - i)) for i in range(N)]  # last first
    conv = conversion([experts], ["w"], [MergeModulelist(0)])
    assert conv.built is not None and conv.built.alike[0] is not None
    step = _both(conv)
    assert len(step.reads) == N and len({id(r.layout) for r in step.reads}) == 1
    (run,) = step.runs
    assert (run.start, run.count, run.layout, list(run.entries)) == (
        0, N, step.reads[0].layout, experts)
    assert not step.loose_reads and _run_first(run, {FILE: 0}.get) == (0, experts[-1].offset)


def test_in_memory_stacks_rank_as_the_read_by_read_order_does():
    experts = [TensorEntry(f"e.{i}.w", TensorSpec((2, 3), torch.float32), None, 0)
               for i in range(N)]
    step = _both(conversion([experts], ["w"], [MergeModulelist(0)]))
    assert step.runs and _run_first(step.runs[0], {"": 7}.get) == (7, 0)


def test_a_run_over_several_files_ranks_as_its_smallest_file_and_offset():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(N)]
    (run,) = _both(conversion([experts], ["w"], [MergeModulelist(0)])).runs
    files = ["b", "a", None, "c"]  # "a" ranks first: its entries' smallest offset wins
    rank = {"a": 0, "b": 1, "c": 2, "": 3}
    for shift in range(len(files)):
        spread = [TensorEntry(e.key, e.spec, files[(i + shift) % len(files)], 1000 - 7 * i)
                  for i, e in enumerate(experts)]
        moved = dataclasses.replace(run, entries=spread)
        reference = min((rank.get(e.file or "", -1), e.offset) for e in spread)
        assert _run_first(moved, rank.get) == (reference[0], reference[1] + run.layout.first)
    unknown = [TensorEntry(e.key, e.spec, "z", e.offset) for e in experts]  # not ranked: -1
    assert _run_first(dataclasses.replace(run, entries=unknown), rank.get)[0] == -1


def test_an_fp8_stack_dequantized_in_columns_as_read_by_read():
    conv = _fp8_stack([torch.float32] * N)
    assert conv.built is not None and conv.built.alike[0] is not None
    step = _both(conv)
    assert all(r.node.kind is NodeKind.DEQUANTIZE for r in step.reads) and len(step.reads) == N


def test_gate_and_up_stacks_concatenated_in_columns_as_read_by_read():
    conv = _fp8_stack([torch.float32] * N, streams=2, ops=[MergeModulelist(0), Concatenate(1)])
    assert conv.built is not None and all(conv.built.alike)
    assert len(_both(conv).reads) == 2 * N


def test_scales_of_two_specs_are_not_alike_and_read_one_by_one():
    conv = _fp8_stack([torch.float32] * (N - 1) + [torch.bfloat16])
    assert conv.built is not None and conv.built.alike == (None,)
    _both(conv)


def test_an_entry_in_memory_among_file_ones_is_not_alike():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(N)]
    experts[4] = TensorEntry("e.4.w", experts[4].spec, None, 0)
    conv = conversion([experts], ["w"], [MergeModulelist(0)])
    assert conv.built is not None and conv.built.alike == (None,)
    _both(conv)


def test_unstacked_outputs_and_partial_fragments_read_one_by_one():
    experts = [entry(f"x.{i}", (4, 3), 48 * i) for i in range(N)]
    _both(conversion([experts], ["y.*"]))  # ten targets: no one fragment shape for all
    _both(conversion([experts[:1]], ["q", "k"], [Chunk(0)]))
    _both(conversion([experts], ["w"], [MergeModulelist(0)]), piece_bytes=10)  # pieces


def test_alike_reads_says_what_is_shared_or_nothing():
    specs = [entry(f"e.{i}", (2, 3), 24 * i) for i in range(N)]
    assert alike_reads(specs, None, None) == (((2, 3), torch.float32, False, True,
                                               None, None, None), specs)
    assert alike_reads(specs[:7], None, None) is None  # too few to be worth it
    other = [*specs[:-1], entry("e.x", (3, 2), 0)]
    assert alike_reads(other, None, None) is None
    strided = [*specs[:-1], StridedEntry("e.s", specs[0].spec, None, 0, contiguous=False)]
    assert alike_reads(strided, None, None) is None
    scales = [TensorSpec((2, 1), torch.float32)] * N
    assert alike_reads(specs, scales, (1, 3)).parts[4:] == ((2, 1), torch.float32, (1, 3))
    assert alike_reads(specs, [*scales[:-1], TensorSpec((1, 1), torch.float32)], (1, 3)) is None


def test_a_whole_stack_places_as_stack_fragments_equal_to_plain_ones():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(N)]
    conv = conversion([experts], ["w"], [MergeModulelist(0)])
    whole = Fragment(Region.full((N, 2, 3)), 0, View.contiguous((N, 2, 3)))
    specs = (tuple(e.spec for e in experts),)
    (stream,) = MergeModulelist(0).place((((whole,),),), specs)
    assert isinstance(stream, StackFragments) and len(stream) == N
    assert stream == tuple((Fragment(Region.full((2, 3)), 0, whole.view.select(0, i)),)
                           for i in range(N))
    assert list(stream.fragments) == [f for (f,) in stream]
    assert stream.region == Region.full((2, 3)) and stream.shape == (2, 3)
    half = Fragment(Region((0, 0, 0), (N // 2, 2, 3)), 0, View.contiguous((N // 2, 2, 3)))
    (part,) = MergeModulelist(0).place((((half,),),), specs)
    assert not isinstance(part, StackFragments) and part[N // 2:] == ((),) * (N - N // 2)
    assert [r.fragment for r in plan_step(conv).reads] == list(stream.fragments)


def test_nodes_replaced_after_building_are_read_back_from_the_nodes():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(N)]
    conv = conversion([experts], ["w"], [MergeModulelist(0)])
    broken = tuple(n for n in conv.nodes if n.kind is not NodeKind.OP)  # a gap: no op stage
    fast, exact = dataclasses.replace(conv, nodes=broken), _exact(conv)
    exact = dataclasses.replace(exact, nodes=broken)
    with pytest.raises(Exception) as caught:
        plan_step(exact)
    with pytest.raises(type(caught.value), match=re.escape(str(caught.value))):
        plan_step(fast)


def test_loose_reads_between_runs_count_as_read_by_read():
    gate = [entry(f"e.{i}.g", (2, 3), 24 * i) for i in range(N)]
    up = [entry(f"e.{i}.u", (2, 3), 24 * (N + i)) for i in range(N)]
    down = [entry(f"e.{i}.d", (2, 3), 24 * (2 * N + i)) for i in range(N)]
    up[2] = TensorEntry("e.2.u", up[2].spec, None, 0)  # in memory: not alike
    conv = conversion([gate, up, down], ["w"], [MergeModulelist(0), Concatenate(1)])
    step = _both(conv)
    assert [(r.start, r.count) for r in step.runs] == [(0, N), (2 * N, N)]
    assert list(step.loose_reads) == list(step.reads[N:2 * N])
