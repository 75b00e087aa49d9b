"""``convert(tensors, mapping)`` / ``revert``: run a mapping on an in-memory ``{key: tensor}``
dict, through the same planner and executor as a load (the sink is a dict).

The executor and the write planners are imported when first used: ``import weightplan``
(and ``weightplan explain``) doesn't pay for them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from weightplan.errors import MappingError
from weightplan.planner.pipelines.load import choose_mapping
from weightplan.planner.inputs.checkpoint import open_checkpoint

if TYPE_CHECKING:
    from weightplan.planner.pipelines.convert import MemoryPlan
    from weightplan.planner.write.record import LoadRecord


class Converted(dict[str, torch.Tensor]):
    """The dict :func:`convert` returns: also remembers what fired, so that
    :func:`revert` undoes exactly that (``.record``)."""

    record: LoadRecord | None = None


def convert(tensors: Mapping[str, torch.Tensor], mapping: object) -> Converted:
    """Apply ``mapping`` (a registered name or a list of transforms) to ``tensors``.

    There is no model, so ``Chunk`` splits into equal pieces unless given ``sizes``.
    Legacy ``LayerNorm.gamma/beta`` renames apply, as when loading.

    Returns:
        A new dict of converted tensors (contiguous; inputs are not modified). It also
        records what fired, so :func:`revert` can undo exactly that.

    Raises:
        MappingError: a converter group lacks one of its source patterns, or two keys
            produce the same output key.
    """
    from weightplan.planner.tensors.ir.quant_build import memory_context, routed_checkpoint
    from weightplan.planner.write.reverse import forward_groups
    from weightplan.planner.pipelines.convert import plan_in_memory
    from weightplan.planner.write.record import record_of_conversions

    if mapping is None:
        raise MappingError("convert() needs a mapping: a registered name or a list of transforms")
    ckpt = open_checkpoint(dict(tensors))
    quant = memory_context(ckpt)  # scaled FP8 stays FP8; its scales follow the ops
    groups = forward_groups(choose_mapping(mapping, None), routed_checkpoint(ckpt, quant))
    plan = plan_in_memory(groups, ckpt, quant)
    out = Converted(_run(plan))
    out.record = record_of_conversions(plan.conversions, ckpt)
    return out


def revert(tensors: Mapping[str, torch.Tensor], mapping: object) -> dict[str, torch.Tensor]:
    """The exact inverse of :func:`convert`.

    Given the dict :func:`convert` returned, the record of its conversions is read
    backwards, node by node (exact even for prefix changes and legacy renames). For any
    other dict the inverse is derived from ``mapping``: inverse converters first, then
    inverse renamings; a transform whose inverse would be a guess (a ``PrefixChange``)
    raises :class:`NotInvertibleError`.
    """
    from weightplan.planner.pipelines.convert import plan_in_memory
    from weightplan.planner.write.reverse import derived_groups, record_groups

    ckpt = open_checkpoint(dict(tensors))
    record = tensors.record if isinstance(tensors, Converted) else None
    if record is not None:
        groups = record_groups(record, ckpt)
    else:
        if mapping is None:
            raise MappingError("revert() needs a mapping: a registered name or transforms")
        groups = derived_groups(choose_mapping(mapping, None).transforms, ckpt)
    return _run(plan_in_memory(groups, ckpt))


def _run(plan: MemoryPlan) -> dict[str, torch.Tensor]:
    from weightplan.executor.dict_sink import DictSink
    from weightplan.executor.run import run_plan

    sink = DictSink()
    run_plan(plan.schedule, plan.checkpoint, sink, progress=False, description="converting")
    order = [t.key for c in plan.conversions for t in c.targets if t.key in sink.results]
    return {key: sink.results[key] for key in order}
