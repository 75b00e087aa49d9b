"""The adapter's section of the explanation: what it is, what changes, what it costs."""

from __future__ import annotations

import dataclasses
from typing import Any

from weightplan.planner.pipelines.adapter_summary import AdapterSummary
from weightplan.planner.pipelines.plan import LoadPlanData, PlanData
from weightplan.units import counted, format_bytes


def adapter_lines(plan: PlanData) -> list[str]:
    """The section's lines (none when the plan loads no adapter)."""
    summary = plan.adapter if isinstance(plan, LoadPlanData) else None
    if summary is None:
        return []
    kind = summary.peft_type + (" (DoRA)" if summary.use_dora else "")
    scale = "alpha/√r, rsLoRA" if summary.use_rslora else "alpha/r"
    lines = [f"adapter: {summary.directory} → adapter {summary.name!r}: {kind}, rank "
             f"{summary.r}, alpha {summary.alpha:g}, scale {summary.scale:.6g} ({scale})",
             f"  targets: {', '.join(summary.targets) or 'none'}"
             + (f" (layers {', '.join(map(str, summary.layers))})" if summary.layers else "")
             + (f"; modules_to_save: {', '.join(summary.modules_to_save)}"
                if summary.modules_to_save else ""),
             f"  loads {summary.loaded_tensors} of the adapter's {counted(summary.file_tensors, 'tensor')}"
             f" ({format_bytes(summary.read_bytes)} read, {format_bytes(summary.model_bytes)} "
             "written)"]
    patterns = [f"{name}: {'; '.join(f'{k} {v:g}' for k, v in pattern)}"
                for name, pattern in (("rank_pattern", summary.rank_pattern),
                                      ("alpha_pattern", summary.alpha_pattern)) if pattern]
    if patterns:
        lines.append(f"  {'; '.join(patterns)} (a module's first matching pattern, else "
                     "the rank and alpha above)")
    for t in summary.tokens:
        lines.append(f"  trainable tokens: rows {list(t.rows)} of {t.base} (trainable_tokens_delta; "
                     "the base's rows copied after the load, for unmerging)")
    if summary.merged:
        lines.append(f"  merged: s·B·A folded into {counted(summary.merged, 'base weight')} (MergeLora "
                     "nodes, float32, cast once to the model's dtype); the model has no "
                     "LoRA layers")
    for r in summary.replaced:
        lines.append(f"  {r.target} from the adapter file, {r.adapter_key} (replaces the "
                     f"base's {r.base_key}: not read)")
    for c in summary.conversions:
        lines.append(f"  layout: {c.description}; rank {c.rank[0]} → {c.rank[1]}, alpha "
                     f"{c.alpha[0]:g} → {c.alpha[1]:g}")
    for s in summary.scale_changes:
        lines.append(f"  scale change: {s.target}: trained {s.trained:.6g}, the model uses "
                     f"{s.model:.6g} (×{s.model / s.trained:.6g})")
    return lines


def adapter_dict(summary: AdapterSummary | None) -> dict[str, Any] | None:
    """The section as plain data (for JSON)."""
    return None if summary is None else dataclasses.asdict(summary)
