"""Coverage and read ranges proven once per stack (``verify_stacks``) find what the exact,
per-fragment and per-read checks find: nothing for a sound stack, and for a broken one
the same problems, worded the same (the exact checks word them)."""

import dataclasses

import torch

from weightplan.ops import Concatenate, MergeModulelist
from weightplan.planner.inputs.checkpoint import FileStamp, TensorEntry
from weightplan.planner.tensors.verify.coverage import coverage_problem
from weightplan.planner.core.geometry import Region, View, stack_fragments
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.lower.placement import Step, plan_step
from weightplan.planner.tensors.lower.read_tasks import read_task
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.verify.verify import _sections, check
from weightplan.planner.tensors.verify.verify_stacks import stack_landed, unproven_reads

from tests.planner.core import FILE, checkpoint, conversion, entry

N = 10  # experts (a stack's reads are made in columns from 8)


def _stack(streams: int = 1):
    experts = [[entry(f"e.{i}.w{s}", (2, 3), 24 * (N * s + i)) for i in range(N)]
               for s in range(streams)]
    ops = [MergeModulelist(0)] if streams == 1 else [MergeModulelist(0), Concatenate(1)]
    conv = conversion(experts, ["w"], ops)
    step = plan_step(conv)
    assert len(step.runs) == streams and all(r.stack is not None for r in step.runs)
    return conv, step, checkpoint(*(e for s in experts for e in s))


def _same_either_way(conv, step: Step, ckpt) -> list[str]:
    """``check`` with the step's runs, and read by read (no runs): the same problems."""
    graph = plan_graph([conv])
    fast = check(graph, [step], ckpt)
    assert fast == check(graph, [dataclasses.replace(step, runs=())], ckpt)
    return fast


def test_a_stack_and_a_gate_up_pair_are_proven_once_per_stack():
    for streams in (1, 2):  # (two: interleaved stacks, each item in every other slot)
        conv, step, ckpt = _stack(streams)
        assert stack_landed(step) is not None
        assert list(unproven_reads(step, _sections(ckpt))) == []
        assert _same_either_way(conv, step, ckpt) == []


def test_the_stacks_as_whole_fragments_cover_as_their_items_do():
    _, step, _ = _stack(2)
    universe = View(step.destinations[0].spec.shape, step.destinations[0].stride)
    whole = stack_landed(step)
    items = [r.fragment for r in step.reads]
    assert whole is not None and len(whole) == 2
    assert coverage_problem(universe, whole) is None is coverage_problem(universe, items)
    assert coverage_problem(universe, whole[:1]) == coverage_problem(universe, items[:N])


def test_overlapping_items_are_refused_and_reported_exactly():
    conv, step, ckpt = _stack()
    stack = step.runs[0].stack
    # the items 3 elements apart: they overlap
    broken = stack_fragments(stack.region, 0, stack.shape, stack.stride, 0, 3, N)
    reads = tuple(dataclasses.replace(r, fragment=f) for r, f in zip(step.reads, broken.fragments,
                                                                     strict=True))
    run = dataclasses.replace(step.runs[0], stack=broken.record())
    problems = _same_either_way(conv, dataclasses.replace(step, reads=reads, runs=(run,)), ckpt)
    assert problems and "two fragments both write element offset 3" in problems[0]


def test_a_read_that_is_not_its_stacks_item_is_refused_and_reported_exactly():
    conv, step, ckpt = _stack()
    twice = dataclasses.replace(step.reads[1], fragment=step.reads[0].fragment)
    broken = dataclasses.replace(step, reads=(step.reads[0], twice, *step.reads[2:]))
    assert stack_landed(broken) is None  # its reads are not the stack's
    problems = _same_either_way(conv, broken, ckpt)
    assert problems and "two fragments both write element offset 0" in problems[0]


def test_a_record_whose_geometry_its_fragments_do_not_follow_is_refused():
    """The record says 6 elements apart; its last item's fragment (the step's read too)
    lands on the first item's elements instead: not proven, and reported exactly."""
    conv, step, ckpt = _stack()
    stack = step.runs[0].stack
    moved = dataclasses.replace(stack.fragments[-1], view=stack.fragments[0].view)
    fragments = [*stack.fragments[:-1], moved]
    run = dataclasses.replace(step.runs[0], stack=dataclasses.replace(stack, fragments=fragments))
    reads = (*step.reads[:-1], dataclasses.replace(step.reads[-1], fragment=moved))
    broken = dataclasses.replace(step, reads=reads, runs=(run,))
    assert stack_landed(broken) is None
    problems = _same_either_way(conv, broken, ckpt)
    assert problems and "two fragments both write element offset 0" in problems[0]


def test_a_run_whose_entries_are_not_its_reads_is_not_proven():
    _, step, ckpt = _stack()
    entries = step.runs[0].entries
    shifted = dataclasses.replace(step.runs[0], entries=(*entries[1:], entries[0]))
    broken = dataclasses.replace(step, runs=(shifted,))
    assert list(unproven_reads(broken, _sections(ckpt))) == list(step.reads)


def test_a_run_outside_the_data_section_is_refused_and_reported_exactly():
    conv, step, ckpt = _stack()
    (stamp,) = ckpt.files
    moved = dataclasses.replace(ckpt, files=(FileStamp(FILE, stamp.size - 30, 0,
                                                       data_start=stamp.data_start + 30),))
    assert unproven_reads(step, _sections(moved)) == step.reads
    problems = _same_either_way(conv, step, moved)  # e.0, e.1 start before it; e.8, e.9 end past it
    assert len(problems) == 4 and all("leaves the data section" in p for p in problems)


def test_a_run_whose_entries_or_layouts_differ_is_refused():
    conv, step, ckpt = _stack()
    run = step.runs[0]
    other = TensorEntry("x", TensorSpec((1, 3), torch.float32), FILE, run.entries[0].offset)
    lying = dataclasses.replace(run, entries=(other, *run.entries[1:]))
    assert unproven_reads(dataclasses.replace(step, runs=(lying,)), _sections(ckpt)) == step.reads
    past = read_task(step.reads[3].node, Region((0, 0), (3, 3)), step.reads[3].fragment, True)
    broken = dataclasses.replace(step, reads=(*step.reads[:3], past, *step.reads[4:]))
    assert unproven_reads(broken, _sections(ckpt)) == broken.reads
    problems = _same_either_way(conv, broken, ckpt)
    assert any("leaves the tensor's bytes" in p for p in problems)


def test_without_a_stack_record_the_exact_checks_run():
    conv, step, ckpt = _stack()
    bare = dataclasses.replace(step, runs=(dataclasses.replace(step.runs[0], stack=None),))
    assert stack_landed(bare) is None
    assert _same_either_way(conv, bare, ckpt) == []


def test_interleaved_stacks_that_overlap_are_reported_exactly():
    _, step, _ = _stack(2)
    universe = View(step.destinations[0].spec.shape, step.destinations[0].stride)
    whole = stack_landed(step)
    assert whole is not None
    same = [whole[0], whole[0]]  # both stacks in the first one's slots
    items = [r.fragment for r in step.reads[:N]] * 2
    assert coverage_problem(universe, same) == coverage_problem(universe, items) is not None


def test_runs_out_of_order_or_overlapping_are_not_proven():
    _, step, ckpt = _stack(2)
    first, second = step.runs
    for runs in ((second, first), (first, dataclasses.replace(second, start=first.count - 1))):
        broken = dataclasses.replace(step, runs=runs)
        assert stack_landed(broken) is None
        assert unproven_reads(broken, _sections(ckpt)) == step.reads
