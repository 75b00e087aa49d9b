"""Strided reads: a rank reads only the row segments of its column slices.

Row-parallel ``o_proj`` / ``down_proj`` (``Shard(1)``), FP8 weights and their scale tiles
included: the bytes a rank requests from storage (``report.bytes_read``: read calls plus
mapped windows) are at most 1.05× the bytes it needs, for Llama, Mixtral and DeepSeek-V3
layouts with hidden 512 on 2 and 4 ranks (they were 1.19-1.88× reading spans); the
tensors equal weightplan's own full load split as DTensor splits it, bit for bit; verify
refuses runs that miss, repeat or leave the region.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import weightplan
from tests.parallel.plans import experts_split_plan
from tests.parallel.strided_fixtures import NAMES, build, family
from weightplan.parallel import TensorParallel
from weightplan.planner.core.geometry import Region
from weightplan.planner.core.sharding.shard_math import slice_local
from weightplan.planner.tensors.lower.strided import ByteRuns, byte_runs, choose_runs
from weightplan.planner.tensors.verify.strided_checks import runs_problem, strided_problems
from weightplan.planner.tensors.verify.verify import verify

_FULL: dict = {}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    root = tmp_path_factory.mktemp("strided")
    return {name: build(name, root) for name in NAMES}


def meta(name: str, dtype=torch.bfloat16):
    cls, cfg = family(name)
    with weightplan.init_empty():
        return cls(cfg).to(dtype)


def rank_plan(directory, name, world, rank, dtype=torch.bfloat16):
    model = meta(name, dtype)  # experts split over the ranks: their down_proj read by runs
    tp = TensorParallel(world_size=world, rank=rank, output="local",
                        plan=experts_split_plan(model))
    return model, weightplan.explain(model, directory, dtype=dtype, tp=tp)


def full(directory, name, dtype=torch.bfloat16):
    if (directory, dtype) not in _FULL:
        model = meta(name, dtype)
        weightplan.explain(model, directory, dtype=dtype).execute()
        _FULL[directory, dtype] = {n: p.data for n, p in model.named_parameters()}
    return _FULL[directory, dtype]


def test_runs_of_a_column_slice_and_of_boxes_in_one_run():
    # rows 0..3 of a [4, 8] fp32 tensor, columns 2..6: 4 runs of 16 bytes, 32 apart
    runs = byte_runs((4, 8), 4, (0, 2), (4, 6))
    assert runs == ByteRuns(8, 16, ((4, 32),))
    assert runs.offsets().tolist() == [8, 40, 72, 104]
    # [E, R, C] sliced on C: one run per (expert, row), the two outer dims merged
    stack = byte_runs((3, 4, 8), 2, (0, 0, 4), (3, 4, 8))
    assert stack.dims == ((12, 16),) and stack.run == 8 and stack.first == 8
    # whole rows are one run; so is a full tensor: the span is read, no runs
    assert choose_runs((4, 8), 4, (1, 0), (3, 8)) is None
    assert choose_runs((4, 8), 4, (0, 0), (4, 8)) is None


def test_the_cost_model_takes_runs_only_when_their_calls_pay():
    # 512 rows: 512-byte runs with 512-byte gaps pay for their calls; 8-byte runs don't
    assert choose_runs((512, 512), 2, (0, 256), (512, 512)) is not None
    assert choose_runs((512, 8), 2, (0, 4), (512, 8)) is None
    assert choose_runs((512, 512), 2, (0, 256), (512, 512), call_bytes=1 << 20) is None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_requests_at_most_105_percent_of_its_bytes(wide, name, fp8, world):
    directory = wide[name][fp8]
    for rank in range(world):
        _, plan = rank_plan(directory, name, world, rank)
        assert not plan.problems, str(plan)
        needed = sum(s.needed_bytes for s in plan.schedule.steps)
        strided = [r for s in plan.schedule.steps for r in s.reads if r.layout.runs is not None]
        assert strided, "no column slice was read by runs"
        assert plan.read_bytes <= 1.05 * needed, (rank, plan.read_bytes, needed)
        spans = sum(s.needed_bytes for s in plan.schedule.steps) + sum(
            r.layout.length - r.layout.runs.nbytes for r in strided)
        assert spans > 1.1 * needed  # reading the spans would have cost more


@pytest.mark.parametrize("name, fp8, dtype", [
    ("llama", False, torch.bfloat16), ("llama", False, torch.float32),  # straight / cast
    ("mixtral", True, torch.bfloat16), ("dsv3", True, torch.bfloat16)])
def test_strided_ranks_equal_the_split_full_load(wide, name, fp8, dtype):
    directory, world = wide[name][fp8], 2
    reference = full(directory, name, dtype)
    for rank in range(world):
        model, plan = rank_plan(directory, name, world, rank, dtype)
        verify(plan.graph, plan.schedule.steps, plan.checkpoint)
        report = plan.execute()
        assert report.bytes_read <= 1.05 * report.bytes_needed
        for key, param in model.named_parameters():
            placement = plan.sharding.plan.placement(key)
            want = slice_local(reference[key], placement.normalized(param.dim()), world, rank)
            assert torch.equal(param.data, want), key


def _strided_task(wide):
    _, plan = rank_plan(wide["llama"][True], "llama", 2, 1)
    for step in plan.schedule.steps:
        for i, task in enumerate(step.reads):
            if task.layout.runs is not None and task.layout.scale_runs is None:
                return plan, step, i, task
    raise AssertionError("no strided read")


def test_verify_refuses_runs_that_miss_repeat_or_leave_the_region(wide):
    plan, step, i, task = _strided_task(wide)
    assert strided_problems(step) == []
    runs = task.layout.runs
    shape, size = tuple(task.entry.spec.shape), task.entry.spec.dtype.itemsize
    span = (task.layout.first, task.layout.length)
    (count, stride), = runs.dims
    wrong = {
        "bytes": dataclasses.replace(runs, dims=((count - 1, stride),)),
        "overlap": dataclasses.replace(runs, dims=((count // 2, stride), (2, runs.run // 2))),
        "outside": dataclasses.replace(runs, first=runs.first - runs.run),
        "span": dataclasses.replace(runs, first=runs.first + stride),
    }
    words = {"bytes": "hold", "overlap": "overlap", "outside": "its runs",  # (see below)
             "span": "leave its span"}
    for what, bad in wrong.items():
        problem = runs_problem(bad, shape, size, task.region, span)
        assert problem is not None and words[what] in problem, (what, problem)
        layout = dataclasses.replace(task.layout, runs=bad)
        reads = list(step.reads)
        reads[i] = dataclasses.replace(task, layout=layout)
        broken = dataclasses.replace(step, reads=tuple(reads))
        assert any(task.entry.key in p for p in strided_problems(broken)), what


def test_runs_crossing_a_row_are_outside_the_region():
    # [4, 8], columns 0..4: a run of 8 elements from (0, 0) ends at (0, 7), outside
    region = Region((0, 0), (4, 4))
    bad = ByteRuns(0, 32, ((2, 64),))
    assert "outside" in runs_problem(bad, (4, 8), 4, region, (0, 128))
    good = byte_runs((4, 8), 4, (0, 0), (4, 4))
    assert runs_problem(good, (4, 8), 4, region, (0, 112)) is None
    assert np.array_equal(good.offsets(), np.arange(4) * 32)


def test_the_plan_shows_which_reads_take_runs(wide):
    _, plan = rank_plan(wide["llama"][False], "llama", 2, 0)
    text = str(plan)
    assert "strided reads:" in text and "row segments" in text
