"""What a load did, kept on the model so that saving can undo exactly that.

A :class:`LoadRecord` holds, for every conversion that loaded, a small frozen record read
off its graph nodes: the reads (checkpoint keys and specs, per source stream), the op
nodes' resolved ops (Chunk sizes, RoPE head sizes included), the sinks (model keys and
their places in the last stage), and the FP8 nodes between them (which reads were
dequantized, which sinks were quantized, with their blocks). Saving reads it backwards
(:mod:`.invert`): no pattern is inverted, nothing is guessed (a ``PrefixChange`` that did
or did not fire is simply what the record says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.checkpoint import Checkpoint, TensorEntry
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.keys.routing import Route
from weightplan.planner.keys.transforms import Renaming
from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.nodes import (
    DequantizeAttrs, Node, NodeKind, QuantizeAttrs, read_attrs, sink_attrs,
)

if TYPE_CHECKING:
    from torch import nn

    from weightplan.planner.core.ops.merge import MergeLora, TakeTrained  # (adapters only)

RECORD_ATTRIBUTE = "_weightplan_record"
_WRITTEN = (TargetStatus.LOAD, TargetStatus.TIED_DUPLICATE)


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
    # floating values quantized into FP8 parameters: (model weight key, its scale key, block);
    # the scale key is no target of its own (it sits at its weight's place)
    quantized: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

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
                          unexpected: frozenset[str] = frozenset(),
                          merged_as: Mapping[str, str] | None = None) -> LoadRecord:
    """The record of conversions run on ``checkpoint`` (a load, or an in-memory convert);
    ``merged_as``: an adapter's key → the base key a weight merged into it is saved as (an
    embedding saved with the adapter, which replaced the base's). A key loaded through a
    base-model-prefix fix-up (another head class's checkpoint) is recorded as the model's
    own checkpoint holds it (:attr:`~.routing.Route.saved_as`), as transformers saves it."""
    kept, not_loaded = [], set(unexpected)
    saved_as = {r.key: r.saved_as for conv in conversions for stream in conv.group.routes
                for r in stream if r.saved_as is not None}  # (another head class's keys)
    names = {**saved_as, **merged_as} if saved_as and merged_as else saved_as or merged_as or {}
    for conv in conversions:
        recorded = _record(conv, names)
        if recorded is None:
            not_loaded.update(e.key for e in conv.group.entries)
        else:
            kept.append(recorded)
    order = data_order(checkpoint)
    if saved_as:
        order = tuple(saved_as.get(k, k) for k in order)
    return LoadRecord(tuple(kept), tuple(sorted(not_loaded, key=natural_key)),
                      dict(checkpoint.metadata), order)


def data_order(checkpoint: Checkpoint) -> tuple[str, ...]:
    """The checkpoint's keys file by file, in data order; keys at one place (empty
    tensors, an in-memory dict) in natural order. Sorted by place alone when no two keys
    share one (a file's usual case: natural keys cost half the record)."""
    entries = checkpoint.entries.values()
    placed = sorted(entries, key=_place)
    if len(set(map(_place, placed))) < len(placed):
        placed = sorted(entries, key=lambda e: (*_place(e), natural_key(e.key)))
    return tuple(e.key for e in placed)


def _place(entry: TensorEntry) -> tuple[str, int]:
    return entry.file or "", entry.offset


def _record(conv: Conversion, merged_as: Mapping[str, str]) -> RecordedConversion | None:
    """``None`` when some output went nowhere: the sources can't be rebuilt from the model."""
    if any(t.status not in _WRITTEN for t in conv.targets):
        return None
    widened: dict[str, Node] = {}
    quantizes: list[Node] = []
    for n in conv.nodes:  # (one pass: the FP8 nodes sit anywhere between reads and sinks)
        if n.kind is NodeKind.DEQUANTIZE:
            widened[read_attrs(n.inputs[0]).entry.key] = n
        elif n.kind is NodeKind.QUANTIZE:
            quantizes.append(n)
    ops, streams, routes = conv.ops, conv.group.sources, conv.group.routes
    if len(ops) == 1 and ops[0].merges_adapter:  # saved as the base it was merged into
        merged = cast("MergeLora | TakeTrained", ops[0])
        first = merged.counts[0]
        ops, streams, routes = merged.base, streams[:first], routes[:first]
    sources = tuple(tuple((merged_as.get(e.key, e.key),
                           widened[e.key].spec if e.key in widened else e.spec)
                          for e in stream) for stream in streams)
    fired: list[Renaming] = []
    for stream in routes:
        for route in stream:
            fired.extend(r for r in _undone(route) if r not in fired)
    quantized = _quantized(conv, quantizes) if quantizes else ()
    scales = {scale for _, scale, _ in quantized}
    targets = tuple((t.key, t.position) for t in conv.targets if t.key not in scales)
    dequantized = tuple((k, n.attrs.block) for k, n in widened.items()
                        if isinstance(n.attrs, DequantizeAttrs))
    return RecordedConversion(sources, ops, targets, tuple(fired), dequantized, quantized)


def _undone(route: Route) -> tuple[Renaming, ...]:
    """The renamings a save undoes for ``route``: those that fired, less the base-model
    prefix fix-up of a key saved as the model's own (first when it ran before the
    renamings, and made ``saved_as`` of the key; else last)."""
    fired = route.fired
    if route.saved_as is None or not fired:
        return fired
    if fired[0].rename(route.key) == route.saved_as:
        return fired[1:]
    return fired[:-1]


def _quantized(conv: Conversion, quantizes: list[Node]
               ) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """(weight key, scale key, block) per quantized value: its two quantize nodes' sinks."""
    sinks = {id(n.inputs[0]): sink_attrs(n).target for n in conv.nodes if n.kind is NodeKind.SINK}
    by_value: dict[int, dict[bool, tuple[str, tuple[int, ...]]]] = {}
    for n in quantizes:
        assert isinstance(n.attrs, QuantizeAttrs)
        by_value.setdefault(id(n.inputs[0]), {})[n.attrs.scale] = (sinks[id(n)], n.attrs.block)
    return tuple((pair[False][0], pair[True][0], pair[False][1]) for pair in by_value.values())


def attach_record(model: nn.Module, record: LoadRecord) -> None:
    """Keep ``record`` on the model (a plain attribute; not part of its state)."""
    object.__setattr__(model, RECORD_ATTRIBUTE, record)


def get_record(model: nn.Module) -> LoadRecord | None:
    return getattr(model, RECORD_ATTRIBUTE, None)


def merge_records(old: LoadRecord | None, new: LoadRecord) -> LoadRecord:
    """A second load into the same model: its conversions replace the ones they overwrite
    (linear in the two records' sizes)."""
    if old is None:
        return new
    written = {key for c in new.conversions for key, _ in c.targets}
    kept = tuple(c for c in old.conversions if written.isdisjoint(k for k, _ in c.targets))
    ordered = set(new.order)
    order = new.order + tuple(k for k in old.order if k not in ordered)
    return LoadRecord(kept + new.conversions,
                      tuple(sorted(set(old.not_loaded) | set(new.not_loaded))),
                      {**old.metadata, **new.metadata}, order)
