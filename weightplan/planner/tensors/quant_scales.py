"""Kept FP8: each kept conversion gets a sibling that carries its scales through its ops.

Merging experts merges their scales, concatenating ``gate``/``up`` concatenates their
grids; the sibling is an ordinary conversion (reads → ops → sinks into the model's
``*_scale_inv`` parameters), so it is placed, verified, scheduled, drawn, recorded and
saved back like any other. An op with no meaning on block scales makes keeping FP8
impossible: a problem on the plan, naming the key.
"""

from __future__ import annotations

from collections.abc import Sequence

from weightplan.errors import QuantizationError
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.tensors.build import (
    Conversion, SinkKind, build_conversion, stage_specs, stages,
)
from weightplan.planner.tensors.nodes import NodeKind
from weightplan.planner.tensors.quant_build import QuantContext, scale_group
from weightplan.planner.quant.blocks import FP8_DTYPES


def add_scale_conversions(conversions: Sequence[Conversion], quant: QuantContext | None,
                          expected: ModelInfo | None, sink: SinkKind = SinkKind.MODEL
                          ) -> tuple[tuple[Conversion, ...], tuple[tuple[str, str], ...]]:
    """``conversions`` plus a scale sibling for each one that keeps FP8; and
    ``(key, message)`` for each that can't."""
    if quant is None:
        return tuple(conversions), ()
    out, problems = list(conversions), []
    for conv in conversions:
        if not _kept(conv, quant):
            continue
        try:
            values = stages(conv)
            specs = tuple(stage_specs(values[k]) for k in range(len(conv.ops)))
            group = scale_group(conv.group, conv.ops, specs, quant)
            out.append(build_conversion(group, expected, None, sink))
        except QuantizationError as e:
            problems.append((conv.label, str(e)))
    return tuple(out), tuple(problems)


def _kept(conv: Conversion, quant: QuantContext) -> bool:
    """FP8 sources (no dequantize) headed for FP8 parameters with scale parameters."""
    if any(n.kind is NodeKind.DEQUANTIZE for n in conv.nodes) or not conv.loads:
        return False
    fp8_sources = any(e.spec.dtype in FP8_DTYPES for e in conv.group.entries)
    return fp8_sources and any(quant.keeps(t.key) for t in conv.targets)
