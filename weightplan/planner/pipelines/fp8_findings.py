"""FP8 findings: what the pairing and the builder found, as problems and notes.

A problem of kind ``quantization`` makes ``execute`` refuse the plan (it would install a
wrong weight): an FP8 weight without its scale, a scale grid that doesn't fit, an FP8
parameter without a scale parameter, FP8 that can't be kept through an op. Scales next
to weights that aren't FP8 are notes (the keys are reported unexpected anyway).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

from weightplan.planner.core.problems import Note, Problem, ProblemKind
from weightplan.planner.pipelines.findings import Findings
from weightplan.planner.pipelines.packed_findings import packed_findings
from weightplan.planner.inputs.fp8_pairs import Fp8ProblemKind
from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.tensors.ir.build import Conversion, TargetStatus
from weightplan.planner.tensors.ir.nodes import NodeKind, QuantizeAttrs
from weightplan.planner.tensors.ir.quant_build import QuantContext
from weightplan.units import counted


def with_fp8_findings(findings: Findings, quant: QuantContext | None,
                      conversions: Sequence[Conversion], kept_problems: Sequence[tuple[str, str]]
                      ) -> Findings:
    """``findings`` plus the FP8 problems and a note saying what the plan does with FP8."""
    if quant is None:
        return findings
    plain_keys, plain_targets, loaded = _plain_copies(conversions)
    problems, notes = [], []
    for p in quant.pairing.problems:
        if p.kind is Fp8ProblemKind.STRAY_SCALE:
            notes.append(Note(p.key, p.message))
        elif p.kind is Fp8ProblemKind.MISSING_SCALE and p.key in plain_keys:
            continue  # float8 bytes copied into a float8 tensor: nothing to scale
        else:
            problems.append(Problem(ProblemKind.QUANTIZATION, p.key, f"{p.kind.value}: {p.message}"))
    problems += [Problem(ProblemKind.QUANTIZATION, key, message)
                 for key, message in kept_problems]
    if quant.model is not None:
        problems += [Problem(ProblemKind.QUANTIZATION, name,
                             f"{name} is an FP8 parameter without a fitting scale parameter "
                             f"({name}_scale_inv); weightplan can't fill it correctly")
                     for name in quant.model.unscaled
                     if name in loaded and name not in plain_targets]
    packed_problems, packed_notes = packed_findings(quant, conversions)
    problems += packed_problems
    notes += packed_notes
    if quant.pairing.quantized or quant.pairing.problems or quant.model is not None \
            and (quant.model.params or quant.model.unscaled):
        notes.append(Note("<fp8>", summary(quant, conversions)))
    return dataclasses.replace(findings, problems=findings.problems + tuple(problems),
                               notes=findings.notes + tuple(notes))


def _plain_copies(conversions: Sequence[Conversion]) -> tuple[set[str], set[str], set[str]]:
    """Checkpoint keys and model keys of conversions that copy float8 into float8 tensors
    without scales (plain data, not block-quantized weights); and every loaded key."""
    keys: set[str] = set()
    targets: set[str] = set()
    loaded: set[str] = set()
    for conv in conversions:
        loads = [t for t in conv.targets if t.status is TargetStatus.LOAD]
        if not loads:
            continue
        loaded.update(t.key for t in loads)
        # cheapest test first: the targets (few), then the entries, then the nodes
        if (all(t.dtype in FP8_DTYPES for t in loads)
                and all(e.spec.dtype in FP8_DTYPES for e in conv.group.entries)
                and not any(n.kind in _QUANTIZING for n in conv.nodes)):
            keys.update(e.key for e in conv.group.entries)
            targets.update(t.key for t in loads)
    return keys, targets, loaded


_QUANTIZING = (NodeKind.DEQUANTIZE, NodeKind.QUANTIZE)
_KIND, _NODES = attrgetter("kind"), attrgetter("nodes")


def summary(quant: QuantContext, conversions: Sequence[Conversion]) -> str:
    """One line: how many weights are dequantized, kept, quantized, with which blocks."""
    # node kinds listed in one C-level pass, then counted; a quantize's scale output isn't
    # a weight
    kinds = list(map(_KIND, chain.from_iterable(map(_NODES, conversions))))
    counts = {k: kinds.count(k) for k in _QUANTIZING}
    if counts[NodeKind.QUANTIZE]:
        counts[NodeKind.QUANTIZE] -= sum(1 for c in conversions for n in c.nodes
                                         if isinstance(n.attrs, QuantizeAttrs) and n.attrs.scale)
    kept = sum(1 for c in conversions for t in c.targets if quant.keeps(t.key))
    kept -= counts[NodeKind.QUANTIZE]
    block = quant.config.block if quant.config is not None else (128, 128)
    source = quant.config.source if quant.config is not None else "no quantization_config"
    pairs = quant.pairing.pairs
    activations = quant.pairing.activation_count
    unused = (f"; {counted(activations, 'activation scale')} not loaded (dequantized weights don't use "
              "them; static activation scales of kept FP8 aren't supported yet)"
              if activations else "")
    return (f"FP8 ({len(pairs)} scaled weights, blocks {block}, from {source}): "
            f"{counts[NodeKind.DEQUANTIZE]} dequantized, {kept} kept in FP8, "
            f"{counts[NodeKind.QUANTIZE]} quantized{unused}")
