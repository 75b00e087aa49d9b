"""Lowering a conversion with quantize nodes: its ops run on tensors, then quantize.

A quantize node can't take fragments back through it (a tile's scale depends on all of
the tile), so such a step holds its reads, runs its op stages on tensors, and quantizes
each value headed for an FP8 parameter into two destinations: the weight and its scale
(:class:`QuantizeTask`). Its other outputs are placed from the last stage as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightplan.planner.core.quant.blocks import workspace_bytes
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, QuantizeAttrs
from weightplan.planner.core.ops.base import Streams
from weightplan.planner.core.spec import TensorSpec


@dataclass(frozen=True, slots=True)
class QuantizeTask:
    """Quantize the value at ``position`` of the last stage into destinations ``weight``
    and ``scale`` (indices into the step's destinations; ``None``: not written)."""

    position: tuple[int, int]
    value: TensorSpec
    block: tuple[int, ...]
    scale_fmt: str
    weight: int | None
    scale: int | None
    scale_spec: TensorSpec

    @property
    def work_bytes(self) -> int:
        """The FP8 weight and scale it produces before writing them, and its workspace."""
        fp8 = self.value.numel
        return fp8 + self.scale_spec.nbytes + workspace_bytes(self.value.shape, self.block)


def quantize_plan(last: Streams[Node], written: list[Node], dests: tuple[Destination, ...]
                  ) -> tuple[Streams[tuple[Fragment, ...]], tuple[QuantizeTask, ...]]:
    """Fragments of the plain outputs of the last stage, and the quantize tasks."""
    from weightplan.planner.tensors.ir.quant_build import scale_format

    position = {n: (i, j) for i, stream in enumerate(last) for j, n in enumerate(stream)}
    final: list[list[tuple[Fragment, ...]]] = [[() for _ in s] for s in last]
    found: dict[tuple[int, int], dict] = {}
    for target, (sink, d) in enumerate(zip(written, dests, strict=True)):
        value = sink.inputs[0]
        if value.kind is NodeKind.QUANTIZE:
            a = value.attrs
            assert isinstance(a, QuantizeAttrs)
            slot = found.setdefault(position[value.inputs[0]], {"value": value.inputs[0].spec})
            slot["scale" if a.scale else "weight"] = target
            slot["block"] = a.block
            if a.scale:
                slot["scale_spec"], slot["fmt"] = value.spec, scale_format(a)
            continue
        value = value.inputs[0] if value not in position else value  # through a cast
        i, j = position[value]
        final[i][j] = (Fragment(Region.full(d.spec.shape), target, View(d.spec.shape, d.stride)),)
    tasks = tuple(QuantizeTask(pos, s["value"], s["block"], s.get("fmt", "float"), s.get("weight"),
                               s.get("scale"), s["scale_spec"]) for pos, s in found.items())
    return tuple(tuple(row) for row in final), tasks


def quantize_fragments(task: QuantizeTask, dests: tuple[Destination, ...]) -> list[Fragment]:
    """The whole-destination fragments a quantize task writes (for the coverage check)."""
    return [Fragment(Region.full(dests[i].spec.shape), i, View(dests[i].spec.shape, dests[i].stride))
            for i in (task.weight, task.scale) if i is not None]
