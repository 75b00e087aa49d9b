"""``verify`` judges the scale tiles every dequantize read takes, as the executor reads
them: inside the scale's bytes and its file's data section."""

import dataclasses

import torch

import weightplan
from tests.fp8.test_fp8_interop import meta_model
from weightplan.planner.core.geometry import Region
from weightplan.planner.core.sharding.fp8_slices import scale_region
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, ReadAttrs
from weightplan.planner.tensors.lower.read_tasks import read_task
from weightplan.planner.tensors.verify.verify import check


def dequantizing_plan(fp8_checkpoints):
    plan = weightplan.explain(meta_model("llama"), fp8_checkpoints("llama")[1],
                              dtype=torch.bfloat16)
    steps = list(plan.schedule.steps)
    k = next(i for i, s in enumerate(steps) if s.reads and s.reads[0].dequantize is not None)
    return plan, steps, k


def with_scale(task, scale: TensorEntry):
    """The read with its dequantize's scale read from ``scale`` instead."""
    weight, old = task.node.inputs
    node = Node(NodeKind.READ, scale.spec, (), ReadAttrs(scale, old.attrs.source))
    return dataclasses.replace(task, node=Node(task.node.kind, task.node.spec, (weight, node),
                                               task.node.attrs))


def test_a_sound_dequantizing_plan_reads_its_scale_tiles_inside_the_file(fp8_checkpoints):
    plan, steps, k = dequantizing_plan(fp8_checkpoints)
    assert check(plan.graph, steps, plan.checkpoint) == []
    task = steps[k].reads[0]
    tiles = scale_region(task.entry.spec.shape, task.scale.spec.shape, task.region,
                         task.dequantize.block)
    assert tiles.numel * task.scale.spec.dtype.itemsize == task.scale_bytes


def test_scale_tiles_outside_the_data_section_are_refused(fp8_checkpoints):
    plan, steps, k = dequantizing_plan(fp8_checkpoints)
    task = steps[k].reads[-1]
    end = max(f.size for f in plan.checkpoint.files)
    far = TensorEntry(task.scale.key, task.scale.spec, task.scale.file, end)
    reads = (*steps[k].reads[:-1], with_scale(task, far))
    steps[k] = dataclasses.replace(steps[k], reads=reads)
    (problem,) = check(plan.graph, steps, plan.checkpoint)
    assert f"read of {task.scale.key} [{end}," in problem and "leaves the data section" in problem


def test_scale_tiles_past_the_scale_are_refused(fp8_checkpoints):
    """A read of rows past its weight would take scale tiles past its scale."""
    plan, steps, k = dequantizing_plan(fp8_checkpoints)
    task = steps[k].reads[-1]
    rows, cols = task.entry.spec.shape
    past = read_task(task.node, Region((0, 0), (rows + 128, cols)), task.fragment, False)
    steps[k] = dataclasses.replace(steps[k], reads=(*steps[k].reads[:-1], past))
    found = check(plan.graph, steps, plan.checkpoint)
    assert any(f"read of {task.scale.key} [" in p and "the scale tiles must lie inside the "
               "scale" in p for p in found)
    assert any(f"read of {task.entry.key} [" in p and "leaves the tensor's bytes" in p
               for p in found)
