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
from weightplan.planner.tensors.ir.build import (
    Conversion, SinkKind, build_conversion, stages,
)
from weightplan.planner.tensors.ir.stages import stage_specs
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.tensors.ir.shard_nodes import Sharding
from weightplan.planner.tensors.ir.build import TargetStatus
from weightplan.planner.tensors.ir.quant_build import QuantContext, scale_group
from weightplan.planner.core.quant.blocks import FP8_DTYPES


def add_scale_conversions(conversions: Sequence[Conversion], quant: QuantContext | None,
                          expected: ModelInfo | None, sink: SinkKind = SinkKind.MODEL,
                          sharding: Sharding | None = None
                          ) -> tuple[tuple[Conversion, ...], tuple[tuple[str, str], ...]]:
    """``conversions`` plus a scale sibling for each one that keeps FP8; and
    ``(key, message)`` for each that can't. Under ``sharding`` a split that cuts through
    a scale block is a problem (see
    :func:`~weightplan.planner.core.sharding.fp8_slices.scale_split_problem`); the
    siblings are every rank's, sharded with their weights by
    :func:`~weightplan.planner.tensors.ir.build.shard_conversion`."""
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
            sibling = build_conversion(group, expected, None, sink, sharding=sharding)
            if sharding is not None:
                problems += _split_problems(conv, sibling, quant, sharding)
            out.append(sibling)
        except QuantizationError as e:
            problems.append((conv.label, str(e)))
    return tuple(out), tuple(problems)


def _split_problems(conv: Conversion, sibling: Conversion, quant: QuantContext,
                    sharding: Sharding) -> list[tuple[str, str]]:
    """Weights and scales of a kept conversion that no rank could split alike."""
    from weightplan.planner.core.quant.blocks import block_of
    from weightplan.planner.core.sharding.fp8_slices import scale_split_problem

    scales = {t.position: t for t in sibling.targets}
    block = quant.pairing.pairs[conv.group.sources[0][0].key].block
    problems = []
    for t in conv.targets:
        s = scales.get(t.position)
        if t.status is not TargetStatus.LOAD or s is None or s.status is not TargetStatus.LOAD:
            continue
        ndim = len(t.produced.shape)
        placement, other = sharding.placement(t.key, ndim), sharding.placement(s.key, ndim)
        if placement != other:
            problems.append((t.key, f"{t.key} and its scale {s.key} are placed differently "
                             f"({placement} and {other}); give them one style"))
            continue
        why = scale_split_problem(placement, t.produced.shape, s.produced.shape,
                                  sharding.world_size, block_of(t.produced.shape, block))
        if why is not None:
            problems.append((t.key, f"under tensor parallel: {why}; "
                             "load it dequantized (a floating model), or pick a world size "
                             f"whose shards are multiples of the block"))
    return problems


def _kept(conv: Conversion, quant: QuantContext) -> bool:
    """FP8 sources (no dequantize) headed for FP8 parameters with scale parameters."""
    # cheapest test first: the targets (a few), the entries, then the nodes (~140k in all)
    return (conv.loads and any(quant.keeps(t.key) for t in conv.targets)
            and any(e.spec.dtype in FP8_DTYPES for e in conv.group.entries)
            and not any(n.kind is NodeKind.DEQUANTIZE for n in conv.nodes))
