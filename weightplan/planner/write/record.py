"""What a load did, kept on the model so that saving can undo exactly that.

A :class:`LoadRecord` lists, for every conversion that loaded, the original checkpoint
keys and specs per source stream, the resolved ops (Chunk sizes, RoPE head sizes
included) and the model keys they produced. Saving runs the inverse ops on the model's
tensors and writes the recorded keys and dtypes: no pattern is inverted, nothing is
guessed (a ``PrefixChange`` that did or did not fire is simply what the record says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from dataclasses import dataclass, field

from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, NodeKind, read_attrs
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.keys.transforms import Renaming

if TYPE_CHECKING:
    from torch import nn

RECORD_ATTRIBUTE = "_weightplan_record"


@dataclass(frozen=True)
class RecordedConversion:
    """One loaded conversion, enough to run it backwards."""

    sources: tuple[tuple[tuple[str, TensorSpec], ...], ...]  # per stream: (checkpoint key, spec)
    ops: tuple[ConversionOp, ...]  # resolved forward ops
    targets: tuple[tuple[str, tuple[int, int]], ...]  # (model key, position in the last stage)
    fired: tuple[Renaming, ...] = ()
    # FP8 sources that were dequantized: (checkpoint key, block); their recorded spec is
    # the dequantized one (what the model holds), so saving writes that by default
    dequantized: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for stream in self.sources for k, _ in stream)


@dataclass(frozen=True)
class LoadRecord:
    """Every loaded conversion, the checkpoint keys that were not loaded, and metadata."""

    conversions: tuple[RecordedConversion, ...]
    not_loaded: tuple[str, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    order: tuple[str, ...] = ()  # original checkpoint keys, file by file, in data order


def record_of_conversions(conversions: Sequence[Conversion], checkpoint: Checkpoint,
                          unexpected: frozenset[str] = frozenset()) -> LoadRecord:
    """The record of conversions run on ``checkpoint`` (a load, or an in-memory convert)."""
    kept, not_loaded = [], set(unexpected)
    for conv in conversions:
        recorded = _record(conv)
        if recorded is None:
            not_loaded.update(e.key for e in conv.group.entries)
        else:
            kept.append(recorded)
    entries = checkpoint.entries.values()
    order = tuple(e.key for e in sorted(entries, key=lambda e: (e.file or "", e.offset,
                                                                natural_key(e.key))))
    return LoadRecord(tuple(kept), tuple(sorted(not_loaded, key=natural_key)),
                      dict(checkpoint.metadata), order)


def _record(conv: Conversion) -> RecordedConversion | None:
    """``None`` when some output went nowhere: the sources can't be rebuilt from the model."""
    if any(t.status not in (TargetStatus.LOAD, TargetStatus.TIED_DUPLICATE) for t in conv.targets):
        return None
    widened = {read_attrs(n.inputs[0]).entry.key: n for n in conv.nodes
               if n.kind is NodeKind.DEQUANTIZE}
    sources = tuple(tuple((e.key, widened[e.key].spec if e.key in widened else e.spec)
                          for e in stream) for stream in conv.group.sources)
    fired: list[Renaming] = []
    for stream in conv.group.routes:
        for route in stream:
            fired.extend(r for r in route.fired if r not in fired)
    targets = tuple((t.key, t.position) for t in conv.targets)
    dequantized = tuple((k, n.attrs.block) for k, n in widened.items()
                        if isinstance(n.attrs, DequantizeAttrs))
    return RecordedConversion(sources, conv.ops, targets, tuple(fired), dequantized)


def attach_record(model: nn.Module, record: LoadRecord) -> None:
    """Keep ``record`` on the model (a plain attribute; not part of its state)."""
    object.__setattr__(model, RECORD_ATTRIBUTE, record)


def get_record(model: nn.Module) -> LoadRecord | None:
    return getattr(model, RECORD_ATTRIBUTE, None)


def merge_records(old: LoadRecord | None, new: LoadRecord) -> LoadRecord:
    """A second load into the same model: its conversions replace the ones they overwrite."""
    if old is None:
        return new
    written = {key for c in new.conversions for key, _ in c.targets}
    kept = tuple(c for c in old.conversions if not any(k in written for k, _ in c.targets))
    order = new.order + tuple(k for k in old.order if k not in set(new.order))
    return LoadRecord(kept + new.conversions, tuple(sorted(set(old.not_loaded) | set(new.not_loaded))),
                      {**old.metadata, **new.metadata}, order)
