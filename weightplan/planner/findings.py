"""What the plan found before reading a byte: missing, unexpected, mismatched, notes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from weightplan.planner.tensors.build import Conversion, Target, TargetStatus
from weightplan.planner.keys.routing import Routing
from weightplan.planner.inputs.model_info import ModelInfo


class ProblemKind(Enum):
    MISSING = "missing"
    UNEXPECTED = "unexpected"
    MISMATCH = "mismatch"
    INCOMPLETE = "incomplete"
    PARTIAL = "partial"  # a converter output has no model tensor, its siblings load
    META_BUFFER = "meta buffer"
    MAPPING = "mapping"  # part of a (bridged) mapping weightplan can't run
    QUANTIZATION = "quantization"  # FP8 that can't load right (execute refuses the plan)


class Mismatch(NamedTuple):
    """Shapes of a converted tensor and of the model tensor it was meant for."""

    checkpoint_shape: tuple[int, ...]
    model_shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    key: str
    message: str


@dataclass(frozen=True, slots=True)
class Note:
    """Information that is not a problem (tied duplicates, fix-ups, casts)."""

    key: str
    message: str


@dataclass(frozen=True)
class Findings:
    missing: frozenset[str]
    unexpected: frozenset[str]
    mismatched: Mapping[str, Mismatch]
    problems: tuple[Problem, ...]
    notes: tuple[Note, ...]


def collect_findings(model: ModelInfo | None, routing: Routing,
                     conversions: tuple[Conversion, ...]) -> Findings:
    problems: list[Problem] = []
    notes: list[Note] = []
    unexpected: set[str] = set()
    mismatched: dict[str, Mismatch] = {}
    produced: set[str] = set()
    for conv in conversions:
        keys = [e.key for e in conv.group.entries]
        statuses = {t.status for t in conv.targets}
        for t in conv.targets:
            if t.model is not None and t.status is not TargetStatus.UNEXPECTED:
                produced.add(t.model.name)
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
    for r in routing.routes:
        if r.note:
            notes.append(Note(r.key, f"{r.key} → {r.renamed}: {r.note}"))
    missing = _missing(model, produced)
    problems.extend(Problem(ProblemKind.MISSING, k, f"{k} is not produced by the checkpoint")
                    for k in sorted(missing))
    if model is not None:
        problems.extend(Problem(ProblemKind.META_BUFFER, b, f"non-persistent buffer {b} is on "
                                "the meta device and no checkpoint holds it; build the model "
                                "under weightplan.init_empty() so buffers stay real")
                        for b in model.meta_buffers)
    return Findings(frozenset(missing), frozenset(unexpected), mismatched, tuple(problems),
                    tuple(notes))


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
