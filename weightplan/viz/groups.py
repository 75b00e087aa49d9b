"""Fold a plan into what its picture draws: parts (drawn conversions) inside clusters.

``detail="grouped"`` (the default) collapses repeated structure twice:

1. Conversions whose graphs have the same shape (same node kinds, ops, specs and wiring,
   keys equal up to their numeric components, see :func:`~weightplan.viz.folding.split_numbers`)
   become one *part*, drawn once for all of them; inside it every read stream of N indexed
   keys is one box (``experts 0..7``).
2. Parts whose model keys share the first indexed component (``model.layers.N``) and the
   same set of indices go into one cluster marked ``×60 (layers 0..59)``.

``detail="full"`` draws every graph node; ``only=`` (a glob over checkpoint and model keys)
keeps the conversions it matches and, unless ``detail`` says otherwise, draws them in full.
Everything is sorted by natural key order, so the same plan gives the same picture.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from weightplan.errors import RenderError
from weightplan.planner.core.problems import ProblemKind
from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.nodes import Node, NodeKind, OpAttrs, ReadAttrs, SinkAttrs
from weightplan.planner.keys.patterns import natural_key
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.units import format_bytes
from weightplan.viz.boxes import Box, BoxContext, Slot, make_box, node_slots
from weightplan.planner.tensors.schedule.schedule import EventKind
from weightplan.viz.folding import fold_keys, ranges, shapes_of
from weightplan.viz.plain import (
    FOLD_AT, fold_plain, plain_box, stream_renames, target_renames, trivial_peak,
)
from weightplan.viz.style import checkpoint_name

DETAILS = ("grouped", "full")
MAX_NOTE_KEYS = 6


@dataclass(frozen=True)
class Part:
    """One drawn conversion, standing for ``count`` conversions of the same shape."""

    boxes: tuple[Box, ...]
    edges: tuple[tuple[int, int], ...]  # (input box, consumer box), indices into ``boxes``
    count: int
    labels: tuple[str, ...] = ()  # per edge: the renames it carries ("" for none)


@dataclass(frozen=True)
class Cluster:
    """Parts drawn in one frame; ``title`` is ``None`` for parts drawn at the top level."""

    title: tuple[str, ...] | None
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Picture:
    """The whole drawing as data: title lines, clusters in order, problem notes."""

    title: tuple[str, ...]
    clusters: tuple[Cluster, ...]
    notes: tuple[str, ...]

    @property
    def boxes(self) -> int:
        """How many nodes the picture draws (the problems note not counted)."""
        return sum(len(p.boxes) for c in self.clusters for p in c.parts)


def plan_picture(plan: LoadPlanData, *, detail: str | None = None, only: str | None = None,
                 fold: bool | None = None) -> Picture:
    """Fold ``plan`` into a :class:`Picture` (see the module docstring).

    Args:
        plan: a :class:`~weightplan.Plan`.
        detail: ``"grouped"`` or ``"full"``; default ``"grouped"``, or ``"full"`` with ``only``.
        only: a glob (``"model.layers.3.*"``) over checkpoint and model keys.
        fold: draw the plain 1:1 copies (:mod:`weightplan.viz.plain`) as one counted box;
            default: from :data:`~weightplan.viz.plain.FOLD_AT` conversions, without ``only``.

    Raises:
        RenderError: an unknown ``detail``, or an ``only`` glob that matches nothing.
    """
    detail = detail or ("full" if only else "grouped")
    if detail not in DETAILS:
        raise RenderError(f"detail must be one of {', '.join(map(repr, DETAILS))}, "
                          f"got {detail!r}")
    convs = _select(plan, only)
    fold = only is None and len(convs) >= FOLD_AT if fold is None else fold
    plain, drawn_convs = fold_plain(convs) if fold else ([], convs)
    slots = _SlotCache(plan, convs, grouped=detail == "grouped")
    clusters = _clusters(plan, _buckets(drawn_convs, slots), slots)
    if plain:
        box = plain_box(plain, _peak_line(plan, plain, slots))
        clusters = (Cluster(None, (Part((box,), (), len(plain)),)), *clusters)
    drawn = sum(len(c.parts) for c in clusters)
    scope = f" · only {only}" if only else ""
    folded = f" ({len(plain)} plain copies in one box)" if plain else ""
    title = (*_title(plan), f"{detail}: {len(convs)} conversions drawn as {drawn}{folded}{scope}")
    return Picture(title, clusters, _notes(plan, only))


def _select(plan: LoadPlanData, only: str | None) -> list[Conversion]:
    convs = [c for c in plan.conversions if c.in_graph]
    if only is None:
        return convs
    chosen = [c for c in convs if any(
        fnmatch.fnmatchcase(k, only) for k in _keys_of(c))]
    if not chosen:
        some = ", ".join(fold_keys(t.key for c in convs for t in c.targets)[:4])
        raise RenderError(f"only={only!r} matches no checkpoint or model key of this plan "
                          f"(model keys look like: {some}); use a glob such as "
                          f"'model.layers.0.*'")
    return chosen


def _keys_of(conv: Conversion) -> list[str]:
    """A conversion's checkpoint keys and model keys (a tied target: every name of it)."""
    return [e.key for e in conv.group.entries] + [t.key for t in conv.targets] + [
        name for names in _ties([conv]).values() for name in names]


def _ties(bucket: list[Conversion]) -> dict[str, tuple[str, ...]]:
    """``{target: its other names}`` of the bucket's tied targets (one tensor, two names)."""
    return {t.key: tuple(a for a in t.model.aliases if a != t.key) for c in bucket
            for t in c.targets if t.model is not None and len(t.model.aliases) > 1}


class _SlotCache:
    """What one picture looks up more than once: :func:`node_slots` of each conversion,
    the schedule step that writes a conversion's sinks, the conversion holding the peak.
    It lives while the picture is drawn (nothing stays on the plan)."""

    def __init__(self, plan: LoadPlanData, convs: list[Conversion], grouped: bool) -> None:
        self.grouped = grouped
        self.by_conv: dict[int, dict[Node, Slot]] = {}  # by id: the conversions outlive it
        self.schedule = plan.schedule
        self.convs = convs
        self.steps: dict[tuple[Node, ...], int] | None = None
        self.peak_owners: set[int] | None = None

    def __call__(self, conv: Conversion) -> dict[Node, Slot]:
        found = self.by_conv.get(id(conv))
        if found is None:
            found = self.by_conv[id(conv)] = node_slots(conv, self.grouped)
        return found

    def step_of(self, conv: Conversion) -> int | None:
        """The first schedule step whose sinks are ``conv``'s (``None``: none)."""
        if self.steps is None:
            self.steps = {}
            for i, program in enumerate(self.schedule.steps):
                self.steps.setdefault(tuple(program.sinks), i)
        return self.steps.get(conv.sinks)

    def holds_peak(self, bucket: list[Conversion]) -> bool:
        """Whether a conversion of ``bucket`` has the sinks of the peak step."""
        if self.peak_owners is None:
            self.peak_owners = self._peak_owners()
        return any(id(c) in self.peak_owners for c in bucket)

    def _peak_owners(self) -> set[int]:
        peak = self.schedule.peak
        if peak is None:
            return set()
        sinks = self.schedule.steps[peak.event.step].sinks
        # a conversion's sinks land in its targets: look at those first, not at every node
        keys = {n.attrs.dest.key for n in sinks if isinstance(n.attrs, SinkAttrs)}
        owners = {id(c) for c in self.convs
                  if any(t.key in keys for t in c.targets) and c.sinks == sinks}
        return owners or {id(c) for c in self.convs if c.sinks == sinks}


def _buckets(convs: list[Conversion], slots: _SlotCache) -> list[list[Conversion]]:
    if not slots.grouped:
        return [[c] for c in convs]
    buckets: dict[tuple, list[Conversion]] = {}
    for conv in convs:
        buckets.setdefault(_signature(conv, slots(conv)), []).append(conv)
    return list(buckets.values())


def _signature(conv: Conversion, slots: dict[Node, Slot]) -> tuple:
    """Equal for conversions whose graphs differ only in the numbers inside keys.

    Per node: kind, slot, op (or a sink's destination kind, or the attrs of the other
    kinds), spec as ``(shape, dtype)`` (compared in C, unlike the dataclass) and where its
    inputs are; then the key templates of every read and sink in node order
    (:func:`shapes_of`: one regex pass for the whole conversion, not one per key)."""
    index = {id(n): i for i, n in enumerate(conv.nodes)}
    keys, shape = [], []
    for n in conv.nodes:
        a = n.attrs
        if type(a) is ReadAttrs:
            keys.append(a.entry.key)
            what: object = None
        elif type(a) is SinkAttrs:
            keys.append(a.dest.key)
            what = a.dest.kind
        elif type(a) is OpAttrs:
            what = repr(a.op)
        else:
            what = a
        inputs = tuple([index[id(m)] for m in n.inputs]) if n.inputs else ()
        shape.append((n.kind, slots[n], what, n.spec.shape, n.spec.dtype, inputs))
    targets = [t.key for t in conv.targets]
    return (tuple(shape), tuple(shapes_of(keys)), tuple(shapes_of(targets)),
            tuple(t.status for t in conv.targets))


def _cluster_key(bucket: list[Conversion]) -> tuple[str, str, tuple[int, ...]]:
    """``("model.layers", "layers", (0, …, 59))`` from the first indexed model-key component;
    ``(label, "", ())`` for a part drawn at the top level."""
    parts = bucket[0].label.split(".")
    first = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if first is None:
        return bucket[0].label, "", ()
    name = parts[first - 1] if first > 0 else "index"
    indices = sorted({int(c.label.split(".")[first]) for c in bucket})
    return ".".join(parts[:first]), name, tuple(indices)


def _clusters(plan: LoadPlanData, buckets: list[list[Conversion]], slots: _SlotCache
              ) -> tuple[Cluster, ...]:
    keyed: dict[tuple[str, str, tuple[int, ...]], list[list[Conversion]]] = {}
    for bucket in sorted(buckets, key=lambda b: natural_key(b[0].label)):
        keyed.setdefault(_cluster_key(bucket), []).append(bucket)
    out = []
    for (prefix, name, indices), group in keyed.items():
        parts = tuple(_part(plan, b, slots, max(len(indices), 1)) for b in group)
        if not indices:
            out.append(Cluster(None, parts))
            continue
        folded = ranges(indices)
        times = f" ×{len(indices)} ({name} {folded.strip('{}')})" if len(indices) > 1 else ""
        nbytes = sum(t.dest.nbytes for b in group for c in b for t in c.targets
                     if t.status is TargetStatus.LOAD)
        out.append(Cluster((f"{prefix}.{folded}{times}", f"{format_bytes(nbytes)} into the model"),
                           parts))
    return tuple(out)


def _part(plan: LoadPlanData, bucket: list[Conversion], slots_of: _SlotCache, span: int) -> Part:
    rep = bucket[0]
    rep_slots = slots_of(rep)
    order: dict[Slot, list[Node]] = {}
    for n in rep.nodes:
        order.setdefault(rep_slots[n], []).append(n)
    every: dict[Slot, list[Node]] = {s: [] for s in order}
    for conv in bucket:
        for n, slot in slots_of(conv).items():
            every[slot].append(n)
    ctx = BoxContext(rep, _materialized(plan, rep, slots_of), _peak_line(plan, bucket, slots_of),
                     f" · ×{len(bucket)}" if len(bucket) != span else "", _ties(bucket))
    slots = list(order)
    boxes = tuple(make_box(order[s][0].kind, order[s], every[s], ctx) for s in slots)
    position = {s: i for i, s in enumerate(slots)}
    edges = dict.fromkeys((position[rep_slots[m]], position[rep_slots[n]])
                          for n in rep.nodes for m in n.inputs)
    labels = _edge_labels(rep, rep_slots, position)
    return Part(boxes, tuple(edges), len(bucket),
                tuple(labels.get(e, "") for e in edges) if labels else ())


def _edge_labels(conv: Conversion, slots: dict[Node, Slot], position: dict[Slot, int]
                 ) -> dict[tuple[int, int], str]:
    """The renames edges carry: a source stream's on the edge that leaves its reads, a
    target's on the edge into its assign (see :mod:`weightplan.viz.plain`)."""
    streams = {e.key: i for i, s in enumerate(conv.group.sources) for e in s}
    targets = {t.key: i for i, t in enumerate(conv.targets)}
    out: dict[tuple[int, int], str] = {}
    for n in conv.nodes:
        for m in n.inputs:
            renames: list[str] = []
            stream = streams.get(_read_key(m) or "")
            if stream is not None and _read_key(n) is None and n.kind is not NodeKind.DEQUANTIZE:
                renames = stream_renames(conv, stream)
            if isinstance(n.attrs, SinkAttrs) and n.attrs.target in targets:
                renames += [r for r in target_renames(conv, targets[n.attrs.target])
                            if r not in renames]
            edge = (position[slots[m]], position[slots[n]])
            if renames and edge not in out:
                out[edge] = "\n".join(renames)
    return out


def _read_key(node: Node) -> str | None:
    """The checkpoint key a read (or the dequantize of a read) stands for."""
    if isinstance(node.attrs, ReadAttrs):
        return node.attrs.entry.key
    if node.kind is NodeKind.DEQUANTIZE and isinstance(node.inputs[0].attrs, ReadAttrs):
        return node.inputs[0].attrs.entry.key
    return None


def _materialized(plan: LoadPlanData, conv: Conversion, slots: _SlotCache) -> int:
    step = slots.step_of(conv)
    return 0 if step is None else len(plan.schedule.steps[step].materialize)


def _peak_line(plan: LoadPlanData, bucket: list[Conversion], slots: _SlotCache) -> str | None:
    """The peak's line on the part that causes it; none when the peak is just the model
    itself (:func:`~weightplan.viz.plain.trivial_peak`: the title says so)."""
    peak = plan.schedule.peak
    if peak is None or trivial_peak(plan.schedule) or not slots.holds_peak(bucket):
        return None
    when = ("while its reads are in flight" if peak.event.kind is EventKind.SUBMIT
            else "while it is assembled")
    return (f"▲ peak {format_bytes(peak.total)} at step {peak.event.step + 1}/"
            f"{len(plan.schedule.steps)}, {when}")


def _title(plan: LoadPlanData) -> tuple[str, str]:
    name = checkpoint_name(plan.checkpoint)
    model = plan.model_info.class_name if plan.model_info is not None else "no model"
    peak = plan.schedule.peak
    at = (f" at step {peak.event.step + 1}/{len(plan.schedule.steps)} ({peak.label})"
          if peak else "")
    if peak is not None and trivial_peak(plan.schedule):  # no step's doing: what makes it
        at = (f" at step {peak.event.step + 1}/{len(plan.schedule.steps)}: model tensors "
              f"{format_bytes(peak.resident)} + in flight "
              f"{format_bytes(peak.in_flight + peak.intermediate)}")
    budget = f" · budget {format_bytes(plan.options.budget)}" if plan.options.budget else ""
    return (f"weightplan plan: {name} → {model}",
            f"{format_bytes(plan.read_bytes)} read · {format_bytes(plan.model_bytes)} into "
            f"the model · peak {format_bytes(plan.peak_bytes)}{at}{budget}")


_ON_NODES = {ProblemKind.MISSING, ProblemKind.UNEXPECTED, ProblemKind.MISMATCH}


def _notes(plan: LoadPlanData, only: str | None) -> tuple[str, ...]:
    """The problem note's lines: missing and unexpected keys, then every other kind of
    problem by its keys (a mismatch is marked on its node)."""
    notes = []
    other: dict[str, list[str]] = {}
    for problem in plan.problems:
        if problem.kind not in _ON_NODES:
            other.setdefault(problem.kind.value, []).append(problem.key)
    kinds = [("missing", plan.missing), ("unexpected", plan.unexpected),
             *((kind, list(dict.fromkeys(keys))) for kind, keys in other.items())]
    for what, every in kinds:
        names = [k for k in every if only is None or fnmatch.fnmatchcase(k, only)]
        if names:
            folded = fold_keys(names)
            extra = len(folded) - MAX_NOTE_KEYS
            more = f", … {extra} more" if extra > 0 else ""
            notes.append(f"{what} ({len(names)}): {', '.join(folded[:MAX_NOTE_KEYS])}{more}")
    return tuple(notes)
