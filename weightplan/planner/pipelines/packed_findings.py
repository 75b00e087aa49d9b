"""Packed-format findings: the pairing's problems, and one note per format.

Each problem (a missing part, a grid that doesn't cover its weight, a packed width that
doesn't match ``weight_shape``, a forbidden dtype, an ``ignore`` entry naming nothing) is
of kind ``quantization``: ``execute`` refuses the plan before a byte is read. The note
names each format once: its group size and scale kind, how many weights, and the bytes
stored and dequantized, or, for weights a model holds as stored (keep-quantized), how many
are kept and their bytes (key ``KEPT``: the plan's header says which it planned). Under
tensor parallel, a rank's slice that cuts a quantization group is a problem too
(:func:`group_split_problems`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain, compress, groupby, repeat
from operator import attrgetter, is_, itemgetter

import torch

from weightplan.planner.core.problems import Note, Problem, ProblemKind
from weightplan.planner.core.quant.formats import Scheme, summary
from weightplan.planner.tensors.ir.build import Conversion
from weightplan.planner.tensors.ir.nodes import DequantizeAttrs, Node, NodeKind
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.planner.tensors.ir.shard_nodes import Sharding
from weightplan.planner.tensors.lower.placement import Step
from weightplan.units import counted, format_bytes

KEPT = "<kept quantized>"


def packed_findings(quant: QuantContext | None, conversions: Sequence[Conversion]
                    ) -> tuple[list[Problem], list[Note]]:
    """``(problems, notes)`` of a plan's packed formats (none without a packed pairing)."""
    if quant is None or quant.packed is None:
        return [], []
    problems = [Problem(ProblemKind.QUANTIZATION, p.key, p.message)
                for p in quant.packed.problems]
    notes = [Note(f"<{s.format}>", line) for s, line in _lines(quant, conversions)]
    return problems, notes + _kept_notes(quant, conversions)


def _kept_notes(quant: QuantContext, conversions: Sequence[Conversion]) -> list[Note]:
    """One note per scheme a model keeps as stored: weights and their bytes (held under
    their own names, or read role by role into merged tensors: their stored weight
    tensor is a conversion's own entry)."""
    assert quant.packed is not None
    weights = quant.packed.stored
    firsts = list(map(id, map(_FIRST, map(_PARTS, weights))))
    # (the firsts a conversion reads, found by a pass over the conversions' entries)
    read = set(firsts).intersection(map(id, chain.from_iterable(chain.from_iterable(
        map(_SOURCES, conversions)))))
    merged = list(compress(weights, map(read.__contains__, firsts))) if read else []
    seen: dict[Scheme, list[int]] = {}
    for w in [*quant.packed.kept.values(), *merged]:
        row = seen.setdefault(w.scheme, [0, 0])
        row[0] += 1
        row[1] += w.stored_bytes
    return [Note(KEPT, f"{s.describe()}: {counted(n, 'weight')} kept as stored ({format_bytes(b)} with "
                 "their scales)") for s, (n, b) in seen.items()]


def _lines(quant: QuantContext, conversions: Sequence[Conversion]) -> list[tuple[Scheme, str]]:
    """One summary per scheme, in first-seen order: stored bytes → dequantized bytes.
    Counted in columns: each conversion's dequantize nodes in runs sharing one attrs
    object (a stack's experts), each run's specs counted by object (Kimi-K2: 69k nodes)."""
    assert quant.packed is not None
    seen: dict[Scheme, list[int]] = {}
    dtypes: dict[Scheme, torch.dtype] = {}
    for conv in conversions:
        nodes = conv.nodes
        kinds = list(map(_KIND, nodes))
        if NodeKind.DEQUANTIZE not in kinds:  # (most conversions: told at C speed)
            continue
        dequantizes = list(compress(nodes, map(is_, kinds, repeat(NodeKind.DEQUANTIZE))))
        ids = map(id, map(_ATTRS, dequantizes))
        for _, run in groupby(zip(ids, dequantizes, strict=True), _FIRST):
            made = list(map(_SECOND, run))
            a = made[0].attrs
            if not isinstance(a, DequantizeAttrs) or not isinstance(a.scheme, Scheme):
                continue
            row = seen.setdefault(a.scheme, [0, 0, 0])
            row[0] += len(made)
            row[1] += _input_bytes(made)
            row[2] += _spec_bytes(made)
            dtypes[a.scheme] = a.dtype
    if not seen and not quant.packed.weights:
        return []
    if not seen:
        return [(w.scheme, f"{w.scheme.describe()}: "
                 f"{counted(len(quant.packed.weights), 'stored weight')}, none loaded")
                for w in list(quant.packed.weights.values())[:1]]
    return [(s, summary(s, c, before, after, dtypes[s])) for s, (c, before, after) in seen.items()]


def _input_bytes(nodes: list[Node]) -> int:
    """The bytes of the nodes' inputs' specs, role by role where the nodes have as many
    inputs each (a stack's experts: each role's column shares one spec)."""
    rows = list(map(_INPUTS, nodes))
    if len(set(map(len, rows))) != 1:
        return _spec_bytes(chain.from_iterable(rows))
    return sum(map(_spec_bytes, zip(*rows, strict=True)))


def _spec_bytes(nodes: Iterable[Node]) -> int:
    """The bytes of the nodes' specs, each spec object's counted once (a stack's nodes
    share one: counted by identity at C speed, then its bytes once)."""
    specs = list(map(_SPEC, nodes))
    if not specs:
        return 0
    ids = list(map(id, specs))
    if ids.count(ids[0]) == len(ids):
        return specs[0].nbytes * len(ids)
    by_id = dict(zip(ids, specs, strict=True))
    return sum(by_id[i].nbytes * n for i, n in Counter(ids).items())


_KIND, _SPEC, _INPUTS = attrgetter("kind"), attrgetter("spec"), attrgetter("inputs")
_ATTRS, _FIRST, _SECOND = attrgetter("attrs"), itemgetter(0), itemgetter(1)
_SOURCES, _PARTS = attrgetter("group.sources"), attrgetter("parts")


def group_split_problems(steps: Sequence[Step], sharding: Sharding | None) -> list[Problem]:
    """A problem per packed weight whose slice on this rank starts or stops inside a
    quantization group along ``in`` (MXFP4 32, NVFP4 16, int ``group_size``): the rank
    would read and decode a group that another rank decodes too, its scale split between
    them. Named by the stored weight, the group size and the boundary."""
    if sharding is None:
        return []
    found: dict[str, Problem] = {}
    for step in steps:
        for task in step.reads:
            packed = task.layout.packed
            if packed is None or packed.cover.split is None or task.entry.key in found:
                continue
            group, at = packed.cover.split
            scheme = task.dequantize.scheme if task.dequantize is not None else None
            what = scheme.describe() if isinstance(scheme, Scheme) else "a packed format"
            found[task.entry.key] = Problem(
                ProblemKind.QUANTIZATION, task.entry.key,
                f"rank {sharding.rank} of {sharding.world_size}: its slice of {task.entry.key} "
                f"(logical {list(task.node.spec.shape)}) has a boundary at in = {at}, inside a "
                f"group of {group} ({what}); a shard must keep every group whole (choose a "
                f"world size that divides in / {group}, or replicate it)")
    return list(found.values())
