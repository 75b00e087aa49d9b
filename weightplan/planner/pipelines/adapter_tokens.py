"""peft's trainable tokens (``trainable_token_indices``) in a plan: the trained rows
(``trainable_tokens_delta``) load from the adapter's file like its other tensors (see
``keys/adapter_keys.name_renames``); the base's rows at those indices
(``trainable_tokens_original``, a non-persistent buffer peft copies from the base weight
when it injects, which an injection on meta leaves on meta) are copied from the loaded
base weight after the load (``executor/token_rows.py``): a note instead of the meta-buffer
problem, and a problem where that weight is placed on the disk (not in memory then)."""

from __future__ import annotations

import dataclasses

from weightplan.planner.core.problems import Note, Problem, ProblemKind
from weightplan.planner.inputs.adapter_model import InjectedAdapter
from weightplan.planner.pipelines.adapter_summary import TrainableTokens
from weightplan.planner.pipelines.findings import Findings
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.tensors.schedule.device_budgets import DISK


def trainable_tokens(injected: InjectedAdapter) -> tuple[TrainableTokens, ...]:
    """The adapter's trainable-tokens layers (one tied to another left out: it shares the
    other's rows and buffer)."""
    return tuple(TrainableTokens(path, injected.name, rows)
                 for path, rows in injected.tokens)


def token_findings(findings: Findings, data: LoadPlanData,
                   tokens: tuple[TrainableTokens, ...]) -> Findings:
    """``findings`` with each token layer's original rows said as filled after the load
    (a tied layer's name of the same buffer too), or refused where its base weight goes
    to the disk."""
    if not tokens:
        return findings
    tails = {f".token_adapter.trainable_tokens_original.{t.name}" for t in tokens}
    originals = {p.key for p in findings.problems if p.kind is ProblemKind.META_BUFFER
                 and any(p.key.endswith(tail) for tail in tails)}
    placement = data.options.placement
    problems = [Problem(ProblemKind.ADAPTER, t.original, (
        f"trainable tokens: {t.base} is placed on the disk, and {t.original} (the base's "
        f"rows {list(t.rows)}, which peft keeps in memory) is filled from it after the load; "
        f"place {t.layer.removesuffix('.token_adapter')} on a device (device_map)"))
        for t in tokens if placement is not None and placement.device_of(t.base) == DISK]
    notes = [Note(t.original, f"trainable tokens: {t.original} (non-persistent) is filled "
                  f"after the load with rows {list(t.rows)} of {t.base}, as peft takes them "
                  "from the base weight") for t in tokens if t.original in originals]
    kept = tuple(p for p in findings.problems if p.key not in originals
                 or p.kind is not ProblemKind.META_BUFFER)
    return dataclasses.replace(findings, problems=tuple(problems) + kept,
                               notes=findings.notes + tuple(notes))
