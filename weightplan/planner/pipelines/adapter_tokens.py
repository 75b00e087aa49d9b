"""peft's trainable tokens (``trainable_token_indices``) in a plan: the trained rows
(``trainable_tokens_delta``) load from the adapter's file like its other tensors (see
``keys/adapter_keys.name_renames``); the base's rows at those indices
(``trainable_tokens_original``, a non-persistent buffer peft copies from the base weight
when it injects, which an injection on meta leaves on meta) are copied from the loaded
base weight after the load (``executor/token_rows.py``): a note instead of the meta-buffer
problem; refused at plan time where that weight (or a layer tied to it) is placed on the disk."""

from __future__ import annotations

import dataclasses

from weightplan.errors import AdapterError
from weightplan.planner.core.problems import Note, ProblemKind
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


def token_findings(findings: Findings, data: LoadPlanData, tokens: tuple[TrainableTokens, ...],
                   config_file: str = "adapter_config.json") -> Findings:
    """``findings`` with each token layer's original rows said as filled after the load
    (a tied layer's name of the same buffer too).

    Raises:
        AdapterError: a token layer's base weight, or a layer tied to it (a tied
            ``lm_head``), is placed on the disk (:func:`refuse_on_disk`).
    """
    if not tokens:
        return findings
    refuse_on_disk(data, tokens, config_file)
    tails = {f".token_adapter.trainable_tokens_original.{t.name}" for t in tokens}
    originals = {p.key for p in findings.problems if p.kind is ProblemKind.META_BUFFER
                 and any(p.key.endswith(tail) for tail in tails)}
    notes = [Note(t.original, f"trainable tokens: {t.original} (non-persistent) is filled "
                  f"after the load with rows {list(t.rows)} of {t.base}, as peft takes them "
                  "from the base weight") for t in tokens if t.original in originals]
    kept = tuple(p for p in findings.problems if p.key not in originals
                 or p.kind is not ProblemKind.META_BUFFER)
    return dataclasses.replace(findings, problems=kept, notes=findings.notes + tuple(notes))


def refuse_on_disk(data: LoadPlanData, tokens: tuple[TrainableTokens, ...], config_file: str) -> None:
    """Refuse, at plan time, trainable tokens whose base weight (any of its tied names: a
    tied ``lm_head`` wrapped by peft too) a placement puts on the disk: peft keeps the
    base's rows (``trainable_tokens_original``) in memory, filled from that weight, and
    accelerate's hooks don't read a tie split between memory and the disk back
    (transformers + peft fail there at the forward, or at the dispatch).

    Raises:
        AdapterError: naming the adapter's config, the tensor and what to place where.
    """
    placement = data.options.placement
    if placement is None:
        return
    for t in tokens:
        spec = data.model_info.tensors.get(t.base) if data.model_info is not None else None
        names = spec.aliases if spec is not None else (t.base,)
        on_disk = [n for n in names if placement.device_of(n) == DISK]
        if not on_disk:
            continue
        modules = sorted({n.removesuffix(".token_adapter.base_layer.weight").removesuffix(".weight")
                          for n in names})
        raise AdapterError(
            f"{config_file} [trainable_token_indices]: {', '.join(on_disk)} placed on the disk; "
            f"{t.original} (the base's rows {list(t.rows)}, which peft keeps in memory) is "
            f"filled from {t.base}, and accelerate's hooks don't read a token layer's weight "
            "back from the disk (transformers + peft fail at the forward); place "
            f"{' and '.join(modules)} on a device or the cpu in device_map (or raise max_memory)")
