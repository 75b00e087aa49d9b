"""Groups for writing a checkpoint: a load record read backwards, or a mapping's inverse.

Saving runs the same builder as loading, with the model's tensors as sources. With a
:class:`~weightplan.planner.write.record.LoadRecord` each recorded conversion is read
backwards (:func:`~weightplan.planner.write.invert.invert`) into exactly the recorded keys
and specs. Without one the model's names are routed through the mapping inverted per
transform: inverse converters first, then inverse renamings in reverse order; a transform
whose inverse would be a guess is refused. Converting on disk routes a checkpoint forward
through a mapping as a load would (:func:`forward_groups`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from weightplan.errors import IndexGapError, MappingError, NotInvertibleError, SaveError
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.route import route_checkpoint
from weightplan.planner.keys.routing import Group, Route, Routing
from weightplan.planner.keys.transforms import (
    LEGACY, PrefixChange, Renaming, WeightConverter, WeightTransform, with_legacy,
)
from weightplan.planner.tensors.ir.build import OutputSpecs
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.planner.write.invert import dequantizing, invert
from weightplan.planner.write.record import LoadRecord
from weightplan.units import counted


@dataclass(frozen=True)
class ReverseGroups:
    """Groups to build, the output layout they must match (record mode) and notes."""

    groups: tuple[Group, ...]
    outputs: OutputSpecs | None  # recorded keys and specs; None when derived
    notes: tuple[str, ...]
    quant: QuantContext | None = None  # the FP8 weights a load quantized: dequantized


def record_groups(record: LoadRecord, source: Checkpoint,
                  aliases: Mapping[str, tuple[str, ...]] | None = None,
                  unsaved: frozenset[str] = frozenset()) -> ReverseGroups:
    """One group per recorded conversion; model tensors not in the record are kept as is
    (``aliases``: every name of each tied tensor, so a tied twin counts as covered); a
    conversion that filled only names the model declares ``unsaved`` is not written."""
    groups: list[Group] = []
    notes: list[str] = []
    covered: set[str] = set()
    names = aliases or {}
    for recorded in record.conversions:
        if unsaved and {k for k, _ in recorded.targets} <= unsaved:
            notes.append(f"{', '.join(recorded.keys)} not written back: the model declares "
                         f"{', '.join(sorted({k for k, _ in recorded.targets}))} unsaved, as "
                         "save_pretrained leaves it out")
            continue
        group = invert(recorded, source.entries)
        groups.append(group)
        for key in [e.key for e in group.entries] + [s for _, s, _ in recorded.quantized]:
            covered.update(names.get(key, (key,)))
    for key in sorted(set(source.entries) - covered, key=natural_key):
        entry = source.entries[key]
        route = Route(key, key, (), note="not in the loaded checkpoint: kept under its model name")
        groups.append(Group(None, ((entry,),), ((route,),), (key,)))
        notes.append(f"{key} was not loaded from the checkpoint; written under its model name")
    if record.not_loaded:
        notes.append(f"{counted(len(record.not_loaded), 'checkpoint key')} not loaded, so "
                     f"not written back: {', '.join(record.not_loaded[:5])}")
    return ReverseGroups(tuple(groups), _recorded_outputs(record, groups), tuple(notes),
                         dequantizing(record.conversions, source.entries))


def _recorded_outputs(record: LoadRecord, groups: list[Group]) -> OutputSpecs:
    """The recorded checkpoint keys and specs: what the outputs must be."""
    specs: dict[str, TensorSpec] = {}
    for recorded in record.conversions:
        for stream in recorded.sources:
            for key, spec in stream:
                specs[key] = spec
    for group in groups:
        if group.explicit is None and group.targets[0] not in specs:
            entry = group.sources[0][0]
            specs[entry.key] = entry.spec
    return OutputSpecs(specs)


def derived_groups(transforms: Sequence[WeightTransform], source: Checkpoint) -> ReverseGroups:
    """Route the model's keys through the inverted mapping (converters, then renamings)."""
    converters, renamings = invert_mapping(transforms)
    try:
        routing = route_checkpoint(source, converters, None)
    except IndexGapError as e:
        raise SaveError(f"the inverse mapping can't collect the model's tensors: {e}") from e
    groups = tuple(Group(g.converter, g.sources, g.routes, g.targets, None, renamings)
                   for g in _complete(routing, "inverse ").groups)
    if any(t.endswith(".weight_scale_2") for g in groups for t in g.targets):
        from weightplan.planner.tensors.ir.packed_keep import modelopt_scalars

        groups = modelopt_scalars(groups)  # (ModelOpt's global scales back to its ``()``)
    return ReverseGroups(groups, None, ())


def forward_groups(choice: MappingChoice, ckpt: Checkpoint) -> ReverseGroups:
    """The mapping (with the legacy renames) routed forward, as a load would, without a
    model (stored quantized tensors follow it as they are, each role by its own key)."""
    return ReverseGroups(_complete(route_checkpoint(ckpt, with_legacy(choice.transforms),
                                                    None)).groups, None, ())


def _complete(routing: Routing, what: str = "") -> Routing:
    """Refuse a converter group that lacks one of its source patterns (no model decides)."""
    if routing.incomplete:
        inc = routing.incomplete[0]
        raise MappingError(f"{what}{inc.converter.describe()}: found {', '.join(inc.present)} "
                           f"but nothing for {', '.join(inc.missing_patterns)}")
    return routing


def invert_mapping(transforms: Sequence[WeightTransform]
                   ) -> tuple[list[WeightConverter], tuple[Renaming, ...]]:
    """Inverse converters (in order) and inverse renamings (in reverse order).

    Legacy renames are skipped (they fire only on legacy checkpoints, which a derived
    inverse can't know about); a ``PrefixChange`` is refused: adding a prefix that may
    already be there is not invertible without knowing which keys had it.
    """
    converters: list[WeightConverter] = []
    renamings: list[Renaming] = []
    for t in transforms:
        if t in LEGACY:
            continue
        if isinstance(t, PrefixChange):
            raise NotInvertibleError(
                f"{t.describe()}: without a record of the load, which keys had the prefix "
                "is unknown. Load the checkpoint with weightplan first (the model then "
                "remembers what fired), pass mapping=None (prefix changes are then left out, as "
                "transformers does), or mapping=[] to write the keys as the model names them")
        inverse = t.inverse()
        if isinstance(inverse, WeightConverter):
            converters.append(inverse)
        elif isinstance(inverse, Renaming):
            renamings.append(inverse)
    return converters, tuple(reversed(renamings))
