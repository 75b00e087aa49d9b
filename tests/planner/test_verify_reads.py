"""``verify`` judges every read the executor issues and every fragment it writes: a read in
the middle of a stack (where a check of a stack's first and last reads, or of a record
made when the stack was lowered, sees nothing) is refused when it leaves its tensor or
its file's data section, reads other bytes than its region's, splits its range with a
gap, or lands where another read lands."""

import dataclasses

import torch

from weightplan.ops import Concatenate, MergeModulelist
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ReadAttrs
from weightplan.planner.tensors.lower.placement import Step, plan_step
from weightplan.planner.tensors.lower.read_tasks import ReadTask, read_task
from weightplan.planner.tensors.verify.verify import check

from tests.planner.core import FILE, checkpoint, conversion, entry

N = 10  # experts in a stack
MIDDLE = N // 2


def stack(streams: int = 1):
    experts = [[entry(f"e.{i}.w{s}", (2, 3), 24 * (N * s + i)) for i in range(N)]
               for s in range(streams)]
    ops = [MergeModulelist(0)] if streams == 1 else [MergeModulelist(0), Concatenate(1)]
    conv = conversion(experts, ["w"], ops)
    return conv, plan_step(conv), checkpoint(*(e for s in experts for e in s))


def with_read(step: Step, k: int, task: ReadTask) -> Step:
    reads = list(step.reads)
    reads[k] = task
    return dataclasses.replace(step, reads=tuple(reads))


def problems(conv, step: Step, ckpt) -> list[str]:
    return check(plan_graph([conv]), [step], ckpt)


def test_a_stack_and_a_gate_up_pair_are_sound():
    for streams in (1, 2):  # (two: interleaved items, each in every other slot)
        conv, step, ckpt = stack(streams)
        assert len(step.reads) == N * streams
        assert problems(conv, step, ckpt) == []


def test_a_middle_read_landing_on_its_neighbour_is_refused():
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    moved = dataclasses.replace(task, fragment=step.reads[MIDDLE - 1].fragment)
    (problem,) = problems(conv, with_read(step, MIDDLE, moved), ckpt)
    assert f"two fragments both write element offset {6 * (MIDDLE - 1)}" in problem


def test_items_that_overlap_are_refused():
    conv, step, ckpt = stack()
    # each item 3 elements after the one before (6 apart would be back to back)
    reads = tuple(dataclasses.replace(r, fragment=Fragment(r.fragment.region, 0,
                                                           View((2, 3), (3, 1), 3 * k)))
                  for k, r in enumerate(step.reads))
    (problem,) = problems(conv, dataclasses.replace(step, reads=reads), ckpt)
    assert "two fragments both write element offset 3" in problem


def test_a_gap_left_by_a_middle_item_is_refused():
    conv, step, ckpt = stack(2)
    last = step.reads[-1]
    moved = dataclasses.replace(last, fragment=Fragment(last.fragment.region, 0, View(
        last.fragment.view.shape, last.fragment.view.stride, 6 * 2 * N)))  # past the end
    (problem,) = problems(conv, with_read(step, len(step.reads) - 1, moved), ckpt)
    assert "no fragment writes element offset" in problem


def test_a_middle_read_past_its_tensor_is_refused():
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    past = read_task(task.node, Region((0, 0), (3, 3)), task.fragment, True)
    found = problems(conv, with_read(step, MIDDLE, past), ckpt)
    assert any(f"read of e.{MIDDLE}.w0 [" in p and "leaves the tensor's bytes" in p
               for p in found)
    assert any("it reads the region [0:3, 0:3] but lands [0:2, 0:3]" in p for p in found)


def test_a_middle_read_outside_the_data_section_is_refused():
    """The middle read reads a tensor past the end of the file (its neighbours' entries,
    the first and the last, are fine)."""
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    far = TensorEntry("far", TensorSpec((2, 3), torch.float32), FILE, 1 << 20)
    node = Node(NodeKind.READ, far.spec, (), ReadAttrs(far, task.node.attrs.source))
    (problem,) = problems(conv, with_read(step, MIDDLE, read_task(node, task.region,
                                                                   task.fragment, True)), ckpt)
    assert f"read of far [{1 << 20}, {(1 << 20) + 24}) leaves the data section" in problem


def test_a_middle_read_of_other_bytes_than_its_region_is_refused():
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    shifted = dataclasses.replace(task, layout=dataclasses.replace(task.layout, first=4))
    found = problems(conv, with_read(step, MIDDLE, shifted), ckpt)  # (and 4 bytes past it)
    assert any(f"read of e.{MIDDLE}.w0" in p and "not the bytes of its region [0:2, 0:3]" in p
               for p in found)


def test_a_middle_read_whose_pieces_leave_a_gap_is_refused():
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    for pieces, words in ((((0, 8), (12, 12)), "its pieces cover 20 of 24 bytes"),
                          (((0, 12), (8, 12)), "are not back to back from 0")):
        split = dataclasses.replace(task, layout=dataclasses.replace(task.layout, pieces=pieces))
        (problem,) = problems(conv, with_read(step, MIDDLE, split), ckpt)
        assert words in problem


def test_a_direct_read_into_a_strided_view_is_refused():
    """A direct read is a byte copy at its view's first byte: the view must be contiguous
    and of its size."""
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    assert task.direct
    view = task.fragment.view
    strided = Fragment(task.fragment.region, 0, View((2, 3), (1, 2), view.offset))
    found = problems(conv, with_read(step, MIDDLE, dataclasses.replace(task, fragment=strided)),
                     ckpt)
    assert any("a direct read fills a contiguous view of its own size" in p for p in found)


def test_a_fragment_aimed_at_a_destination_the_step_lacks_is_refused():
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    astray = dataclasses.replace(task, fragment=dataclasses.replace(task.fragment, target=1))
    found = problems(conv, with_read(step, MIDDLE, astray), ckpt)
    assert any("a fragment lands in destination #1, but the step writes 1" in p for p in found)


def test_a_task_of_no_read_node_is_refused():
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    op = next(n for n in conv.nodes if n.kind is NodeKind.OP)
    found = problems(conv, with_read(step, MIDDLE, dataclasses.replace(task, node=op)), ckpt)
    assert any("a read task lowers a read node, or a dequantize of two" in p for p in found)


def test_a_task_whose_entry_is_not_its_nodes_is_refused():
    # the executor reads the task's entry: it must be the read node's
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    other = step.reads[MIDDLE + 1].entry
    found = problems(conv, with_read(step, MIDDLE, dataclasses.replace(task, entry=other)), ckpt)
    assert any(f"a read task of {task.entry.key} carries the entry of {other.key}" in p
               for p in found)


def test_a_shared_steps_verdict_is_given_to_every_rank_and_only_for_that_step():
    """Ranks planned together share a step (as an object) and its verdict: each rank's
    check reports a shared broken step's problems; another step, or the same step against
    another checkpoint, is checked on its own."""
    conv, step, ckpt = stack()
    task = step.reads[MIDDLE]
    broken = with_read(step, MIDDLE, read_task(task.node, Region((0, 0), (3, 3)),
                                               task.fragment, True))
    graph, checked = plan_graph([conv]), {}
    alone = check(graph, [broken], ckpt)
    assert alone and check(graph, [broken], ckpt, checked) == alone
    assert check(graph, [broken], ckpt, checked) == alone  # (the second rank's)
    assert list(checked) == [id(broken)] and checked[id(broken)][2] == alone
    assert check(graph, [step], ckpt, checked) == []  # (a step of its own)
    other = checkpoint(*ckpt.entries.values())
    assert check(graph, [broken], other, checked) == alone  # (checked again)
    assert [known[1] is other for known in checked.values()] == [True, False]
