"""The steps of one read into one destination (a plain key's) are shown sound in columns
(``lone_reads.sound_steps``); any such step that breaks an invariant is left to
``step_problems``, so ``check`` finds exactly what it finds one step at a time."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.inputs.checkpoint import FileStamp
from weightplan.planner.pipelines.lower import plan_graph
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.tensors.lower.placement import Step, plan_step
from weightplan.planner.tensors.lower.read_tasks import read_task
from weightplan.planner.tensors.verify import verify as verify_module
from weightplan.planner.tensors.verify.lone_reads import sound_steps
from weightplan.planner.tensors.verify.read_checks import sections
from weightplan.planner.tensors.verify.verify import check

from tests.planner.core import FILE, checkpoint, conversion, entry


def plain(shape=(2, 3), dtype=torch.float32, at=0):
    """A key read into a fresh tensor of its own name, its step, and the checkpoint."""
    e = entry("a.w", shape, at, dtype)
    conv = conversion([[e]], ["a.w"])
    return conv, plan_step(conv), checkpoint(e)


def one_by_one(graph, steps, ckpt, monkeypatch) -> list[str]:
    """``check`` with no step shown sound in columns: every step through ``step_problems``."""
    with monkeypatch.context() as m:
        m.setattr(verify_module, "sound_steps", lambda steps, where: [False] * len(steps))
        return check(graph, steps, ckpt)


def with_task(step: Step, **changes) -> Step:
    return dataclasses.replace(step, reads=(dataclasses.replace(step.reads[0], **changes),))


def broken(step: Step, ckpt, how: str):
    """``step`` (and its checkpoint) broken one way; every way is one ``verify`` words."""
    task = step.reads[0]
    layout, frag, dest = task.layout, task.fragment, step.destinations[0]
    if how == "region":  # reads one row of two, lands the whole
        return with_task(step, region=Region((0, 0), (1, 3))), ckpt
    if how == "first":
        return with_task(step, layout=dataclasses.replace(layout, first=4)), ckpt
    if how == "pieces":
        pieces = ((0, 8), (12, layout.length - 12))
        return with_task(step, layout=dataclasses.replace(layout, pieces=pieces)), ckpt
    if how == "strided view":
        return with_task(step, fragment=Fragment(frag.region, 0, View((2, 3), (1, 2)))), ckpt
    if how == "offset view":
        return with_task(step, fragment=Fragment(frag.region, 0, View((2, 3), (3, 1), 1))), ckpt
    if how == "target":
        return with_task(step, fragment=dataclasses.replace(frag, target=1)), ckpt
    if how == "unplaced":
        return with_task(step, fragment=None), ckpt
    if how == "entry":
        other = entry("b.w", task.entry.spec.shape, 96, task.entry.spec.dtype)
        return with_task(step, entry=other), ckpt
    if how == "past the tensor":
        past = read_task(task.node, Region((1, 0), (3, 3)), frag, True)
        return dataclasses.replace(step, reads=(past,)), ckpt
    if how == "section":
        (stamp,) = ckpt.files
        moved = FileStamp(FILE, stamp.size, 0, data_start=stamp.data_start + 8)
        return step, dataclasses.replace(ckpt, files=(moved,))
    if how == "destination":  # a destination one row longer than what lands in it
        wider = Destination(dest.key, dest.aliases, TensorSpec((3, 3), dest.spec.dtype),
                            dest.kind, (3, 1))
        return dataclasses.replace(step, destinations=(wider,)), ckpt
    assert how == "twice"
    return dataclasses.replace(step, reads=(task, task)), ckpt


WAYS = ("region", "first", "pieces", "strided view", "offset view", "target", "unplaced",
        "entry", "past the tensor", "section", "destination", "twice")


def test_a_plain_keys_step_is_shown_sound_in_columns():
    conv, step, ckpt = plain()
    assert sound_steps([step], sections(ckpt)) == [True]
    assert check(plan_graph([conv]), [step], ckpt) == []


@pytest.mark.parametrize("how", WAYS)
def test_a_broken_plain_step_is_worded_as_one_by_one(how, monkeypatch):
    conv, step, ckpt = plain()
    bad, ckpt = broken(step, ckpt, how)
    assert sound_steps([bad], sections(ckpt)) == [False]
    graph = plan_graph([conv])
    found = check(graph, [bad], ckpt)
    assert found and found == one_by_one(graph, [bad], ckpt, monkeypatch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("none",) + WAYS),
                          st.sampled_from((torch.float32, torch.bfloat16, torch.int8))),
                min_size=1, max_size=6))
def test_check_finds_what_every_step_one_by_one_finds(rows):
    """Plain steps, some broken, some not, of several dtypes in one pass: ``check`` finds
    exactly the problems ``step_problems`` finds step by step, and the columns spare only
    steps that have none."""
    convs, steps, entries = [], [], []
    for k, (how, dtype) in enumerate(rows):
        e = entry(f"k{k}.w", (2, 3), 64 * k, dtype)
        conv = conversion([[e]], [f"k{k}.w"])
        step = plan_step(conv)
        if how not in ("none", "section"):
            step, _ = broken(step, checkpoint(e), how)
        convs.append(conv)
        steps.append(step)
        entries.append(e)
    ckpt = checkpoint(*entries)
    where = sections(ckpt)
    shown = sound_steps(steps, where)
    mp = pytest.MonkeyPatch()
    try:
        assert check(plan_graph(convs), steps, ckpt) == one_by_one(plan_graph(convs), steps,
                                                                   ckpt, mp)
    finally:
        mp.undo()
    for (how, _), step, sound in zip(rows, steps, shown, strict=True):
        assert sound == (how in ("none", "section"))  # (the section is the file's: all sound)
        if sound:
            assert verify_module.step_problems(step, where) == []
