"""``convert(tensors, mapping)``: run a mapping on an in-memory ``{key: tensor}`` dict."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from weightplan.errors import ConflictingTransformError, MappingError
from weightplan.planner.tensors.build import Conversion, build_conversions
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.explain import choose_mapping
from weightplan.planner.keys.routing import route_checkpoint
from weightplan.planner.write.record import record_of_conversions
from weightplan.planner.write.reverse import derived_groups, record_groups
from weightplan.planner.keys.transforms import LEGACY


def convert(tensors: Mapping[str, torch.Tensor], mapping: object) -> dict[str, torch.Tensor]:
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
    if mapping is None:
        raise MappingError("convert() needs a mapping: a registered name or a list of transforms")
    choice = choose_mapping(mapping, None)
    transforms = choice.transforms + tuple(t for t in LEGACY if t not in choice.transforms)
    ckpt = open_checkpoint(dict(tensors))
    routing = route_checkpoint(ckpt, transforms, None)
    if routing.incomplete:
        inc = routing.incomplete[0]
        raise MappingError(f"{inc.converter.describe()}: found {', '.join(inc.present)} but "
                           f"nothing for {', '.join(inc.missing_patterns)}")
    out = Converted()
    conversions = build_conversions(routing.groups, None, None)
    for conv in conversions:
        for key, value in run_conversion(conv, ckpt.tensors).items():
            if key in out:
                raise ConflictingTransformError(f"two conversions produce {key}")
            out[key] = value
    out.record = record_of_conversions(conversions, ckpt)
    return out


def run_conversion(conv: Conversion, tensors: Mapping[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """Run one conversion's ops on real tensors; outputs by target key."""
    streams = tuple(tuple(tensors[e.key] for e in stream) for stream in conv.group.sources)
    for op in conv.ops:
        streams = op.forward(streams)
    return {t.key: streams[t.position[0]][t.position[1]].contiguous().clone()
            if _shares(streams[t.position[0]][t.position[1]], tensors) else
            streams[t.position[0]][t.position[1]].contiguous()
            for t in conv.targets}


def _shares(tensor: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> bool:
    ptr = tensor.untyped_storage().data_ptr()
    return any(t.untyped_storage().data_ptr() == ptr for t in tensors.values())


class Converted(dict):
    """The dict :func:`convert` returns: also remembers what fired, so that
    :func:`revert` undoes exactly that (``.record``)."""

    record = None


def revert(tensors: Mapping[str, torch.Tensor], mapping: object) -> dict[str, torch.Tensor]:
    """The exact inverse of :func:`convert`.

    Given the dict :func:`convert` returned, its record is replayed backwards (exact even
    for prefix changes and legacy renames). For any other dict the inverse is derived from
    ``mapping``: inverse converters first, then inverse renamings; a transform whose
    inverse would be a guess (a ``PrefixChange``) raises :class:`NotInvertibleError`.
    """
    ckpt = open_checkpoint(dict(tensors))
    record = getattr(tensors, "record", None)
    if record is not None:
        reverse = record_groups(record, ckpt)
    else:
        if mapping is None:
            raise MappingError("revert() needs a mapping: a registered name or transforms")
        reverse = derived_groups(choose_mapping(mapping, None).transforms, ckpt)
    out: dict[str, torch.Tensor] = {}
    for conv in build_conversions(reverse.groups, reverse.outputs, None):
        for key, value in run_conversion(conv, ckpt.tensors).items():
            if key in out:
                raise ConflictingTransformError(f"two conversions produce {key}")
            out[key] = value
    return out
