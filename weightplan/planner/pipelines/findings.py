"""What the plan found before reading a byte: missing, unexpected, mismatched, lossy casts,
notes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter

import torch

from weightplan.planner.pipelines.stored_ties import stored_tie_notes
from weightplan.planner.core.problems import Mismatch, Note, Problem, ProblemKind
from weightplan.planner.tensors.ir.build import Conversion, Target, TargetStatus
from weightplan.planner.keys.routing import Routing
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.inputs.model_init import matches


@dataclass(frozen=True)
class Findings:
    missing: frozenset[str]
    unexpected: frozenset[str]
    mismatched: Mapping[str, Mismatch]
    problems: tuple[Problem, ...]
    notes: tuple[Note, ...]
    ignored_missing: frozenset[str] = frozenset()  # missing, but declared ignorable


def collect_findings(model: ModelInfo | None, routing: Routing,
                     conversions: tuple[Conversion, ...], checkpoint_notes: tuple[Note, ...] = ()) -> Findings:
    problems: list[Problem] = []
    notes = list(checkpoint_notes)
    unexpected: set[str] = set()
    mismatched: dict[str, Mismatch] = {}
    produced: set[str] = set()
    for conv in conversions:
        statuses = {t.status for t in conv.targets}
        for t in conv.targets:
            if t.model is not None and t.status is not TargetStatus.UNEXPECTED:
                produced.add(t.model.name)
            if t.dtype is not t.produced.dtype and t.status is TargetStatus.LOAD:
                lost = lossy_cast(t.produced.dtype, t.dtype)
                if lost is not None:
                    problems.append(Problem(ProblemKind.LOSSY_CAST, t.key,
                                            _lossy_text(conv, t, lost)))
        if statuses == _LOADS:  # the usual case: nothing to report, the keys aren't listed
            continue
        keys = [e.key for e in conv.group.entries]
        for t in conv.targets:
            if t.status is TargetStatus.MISMATCH and t.expected is not None:
                mismatched[t.key] = Mismatch(t.produced.shape, t.expected.shape)
                problems.append(Problem(ProblemKind.MISMATCH, t.key, _mismatch_text(conv, t)))
            if t.status is TargetStatus.TIED_DUPLICATE and t.model is not None:
                notes.append(Note(t.key, f"tied to {t.model.name}, which is loaded from another "
                                         f"checkpoint key; {', '.join(keys)} not read"))
        if statuses == {TargetStatus.UNEXPECTED}:
            unexpected.update(keys)
            problems.extend(Problem(ProblemKind.UNEXPECTED, k, _unexpected_text(conv, k))
                            for k in keys)
        elif TargetStatus.UNEXPECTED in statuses:
            for t in conv.targets:
                if t.status is TargetStatus.UNEXPECTED:
                    problems.append(Problem(ProblemKind.PARTIAL, t.key,
                                            f"converter output {t.key} (from {', '.join(keys)}) "
                                            "has no model tensor; it is not kept"))
    for inc in routing.incomplete:
        unexpected.update(inc.present)
        problems.append(Problem(ProblemKind.INCOMPLETE, inc.targets[0],
                                f"{inc.converter.describe()}: found {', '.join(inc.present)} "
                                f"but nothing for {', '.join(inc.missing_patterns)}; "
                                f"{', '.join(inc.targets)} can't be built"))
    notes.extend(Note(r.key, f"{r.key} → {r.renamed}: {r.note}")
                 for r in filter(_NOTE, routing.routes))  # (a C-level pass over the keys)
    missing = _missing(model, produced)
    problems.extend(Problem(ProblemKind.MISSING, k, f"{k} is not produced by the checkpoint")
                    for k in sorted(missing))
    return _model_declarations(model, Findings(frozenset(missing), frozenset(unexpected),
                                               mismatched, tuple(problems), tuple(notes)))


_LOADS = {TargetStatus.LOAD}
_NOTE = attrgetter("note")


def _model_declarations(model: ModelInfo | None, found: Findings) -> Findings:
    """What the model declares: ignorable keys become notes, buffers its init rebuilds
    are notes, the others are problems; declared ties are noted."""
    if model is None:
        return found
    problems, notes = [], list(found.notes)
    # each ignorable key with the pattern it matches (looked for once per key)
    missing_patterns = _matched(model.ignore_missing, found.missing)
    unexpected_patterns = _matched(model.ignore_unexpected, found.unexpected)
    ignored_missing, ignored_unexpected = set(missing_patterns), set(unexpected_patterns)
    ignored = ignored_missing | ignored_unexpected
    for p in found.problems:
        if p.key in ignored and p.kind in (ProblemKind.MISSING, ProblemKind.UNEXPECTED):
            pattern = missing_patterns[p.key] if p.key in ignored_missing \
                else unexpected_patterns[p.key]
            notes.append(Note(p.key, f"{p.message}; the model declares it ignorable "
                                     f"({pattern!r}){_init_text(p.key in ignored_missing)}"))
        else:
            problems.append(p)
    for b in model.meta_buffers:
        if b in model.rebuilt_buffers:
            notes.append(Note(b, f"non-persistent buffer {b} is on meta; the model's own init "
                                 "rebuilds it after loading"))
        else:
            problems.append(Problem(ProblemKind.META_BUFFER, b, _META_TEXT.format(b)))
    notes.extend(_shared_notes(model, found.missing))
    notes.extend(stored_tie_notes(model))
    return Findings(found.missing - ignored_missing, found.unexpected - ignored_unexpected,
                    found.mismatched, tuple(problems), tuple(notes), frozenset(ignored_missing))


def _shared_notes(model: ModelInfo, missing: frozenset[str]) -> list[Note]:
    """One note per tensor the model holds under several names (one object, or a tie the
    model declares and the plan restored): which names, and that it is filled once."""
    retied = {t for _, t in model.declared_ties}
    notes = []
    for name, t in model.tensors.items():
        if name != t.name or len(t.aliases) < 2:
            continue
        others = t.aliases[1:]
        how = " (tied as the model declares)" if retied.intersection(others) else ""
        once = "" if name in missing else "; loaded once"
        notes.append(Note(others[0], f"{', '.join(others)} and {name} are one tensor{how}"
                                     f"{once}"))
    return notes


def _matched(patterns: tuple[str, ...], keys: frozenset[str]) -> dict[str, str]:
    """The keys a pattern is found in, each with the first such pattern."""
    found = {k: matches(patterns, k) for k in keys} if patterns else {}
    return {k: p for k, p in found.items() if p}


_META_TEXT = ("non-persistent buffer {} is on the meta device, no checkpoint holds it and the "
              "model's own init can't rebuild it; build the model under weightplan.init_empty() "
              "(buffers stay real) instead of torch.device('meta')")


def _init_text(missing: bool) -> str:
    return "; it gets the model's own init" if missing else "; not loaded"


def _missing(model: ModelInfo | None, produced: set[str]) -> set[str]:
    if model is None:
        return set()
    return {t.name for t in model.unique() if t.name not in produced}


def _unexpected_text(conv: Conversion, key: str) -> str:
    names = ", ".join(t.key for t in conv.targets)
    if names == key:
        return f"{key} has no model tensor of that name"
    return f"{key} becomes {names}, which the model doesn't have"


def _mismatch_text(conv: Conversion, t: Target) -> str:
    chain = " → ".join(repr(op) for op in conv.ops) or "no ops"
    keys = ", ".join(e.key for e in conv.group.entries[:4])
    more = f" and {len(conv.group.entries) - 4} more" if len(conv.group.entries) > 4 else ""
    return (f"{t.key}: checkpoint gives {list(t.produced.shape)} but the model has "
            f"{list(t.expected.shape) if t.expected else '?'} (from {keys}{more}; ops: {chain})")


def lossy_cast(produced: torch.dtype, written: torch.dtype) -> str | None:
    """What casting ``produced`` to ``written`` loses when the two are of different kinds
    (complex → real, float → integer, integer → bool), else ``None``. Casts within a kind
    (bf16 → fp32, FP8 → bf16) and widening ones (bool → int, int → float) are allowed."""
    if produced.is_complex and not written.is_complex:
        return "the imaginary part"
    if written.is_complex or written.is_floating_point:
        return None
    if produced.is_floating_point:
        return "the fraction (and every value out of range)"
    if written is torch.bool and produced is not torch.bool:
        return "every value but 0 and 1"
    return None


def _lossy_text(conv: Conversion, t: Target, lost: str) -> str:
    entries = conv.group.entries
    where = ", ".join(f"{e.key} in {e.file or 'the dict given'}" for e in entries[:2])
    more = f" and {len(entries) - 2} more" if len(entries) > 2 else ""
    have, want = _name(t.produced.dtype), _name(t.dtype)
    return (f"{t.key}: the checkpoint gives {have} ({where}{more}) but the model tensor is "
            f"{want}; the cast would drop {lost} (torch does it silently), so it is refused: "
            f"make the model tensor {have}, or convert it in the mapping (an op producing "
            f"{want})")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
