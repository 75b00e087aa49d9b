"""The explanation as text: a grouped table, totals, the peak estimate, every problem."""

from __future__ import annotations

import shutil
import sys

from weightplan.planner.findings import ProblemKind
from weightplan.planner.plan import Direction, LoadPlanData, PlanData
from weightplan.planner.write.write_plan import WritePlanData
from weightplan.units import format_bytes
from weightplan.viz.rows import Row
from weightplan.viz.folding import fold_keys
from weightplan.viz.rows import mapping_rows

MAX_LIST = 12


def _rule_text(row: Row) -> str:
    """The row's rule with its op chain (an FP8 dequantize shows on renamed keys too)."""
    if not row.ops:
        return row.rule
    if "convert" in row.rule:
        return row.rule.replace("convert", f"convert {row.ops}", 1)
    return row.ops if row.rule == "as is" else f"{row.rule}; {row.ops}"


def explain_text(plan: PlanData, width: int | None = None) -> str:
    """Render ``plan`` as the text ``print(plan)`` shows."""
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 120
    lines = header_lines(plan) + [""] + mapping_lines(plan, max(width, 80)) + [""]
    lines += total_lines(plan) + problem_lines(plan) + note_lines(plan)
    return "\n".join(lines) + "\n"


def header_lines(plan: PlanData) -> list[str]:
    if isinstance(plan, WritePlanData):
        return write_header_lines(plan)
    assert isinstance(plan, LoadPlanData)
    ckpt = plan.checkpoint
    files = f"{len(ckpt.files)} file(s), " if ckpt.files else ""
    model = "no model" if plan.model_info is None else (
        f"{plan.model_info.class_name} ({len(plan.model_info.unique())} tensors, "
        f"{format_bytes(plan.model_info.nbytes)})")
    extra = len(plan.transforms) - len(plan.mapping.transforms)
    mapping = plan.mapping.key or "none"
    lines = [f"weightplan plan: {ckpt.description} ({files}{len(ckpt)} tensors, "
             f"{format_bytes(ckpt.nbytes)}) → {model}",
             f"mapping: {mapping} — {plan.mapping.reason} (+{extra} legacy renames)"]
    subs = plan.mapping.submodules  # which submodule got which mapping (SPEC §5)
    if len(subs) > 1 or any(s.path for s in subs):
        lines += [f"  {s.describe()}" for s in subs]
    return lines


def write_header_lines(plan: WritePlanData) -> list[str]:
    layout = plan.layout
    what = f"{plan.direction.value} ({plan.inversion.description})"
    return [f"weightplan {what}: {plan.checkpoint.description} ({len(plan.checkpoint)} tensors) → "
            f"{plan.directory} ({len(layout.files)} file(s), {len(layout.locations)} tensors, "
            f"{format_bytes(layout.total_bytes)})",
            f"mapping: {plan.mapping.key or 'none'} — {plan.mapping.reason}"]


def mapping_lines(plan: PlanData, width: int) -> list[str]:
    """One block per folded row: rule, checkpoint keys, then ``→ model key`` and sizes."""
    lines, previous, n = [], None, 0
    for row in mapping_rows(plan.conversions):
        rule = _rule_text(row)
        if rule != previous or row.ops:  # consecutive rows of one simple rule share a header
            n += 1
            lines.append(f"#{n:<3} {rule}")
        previous = rule
        count = f" ×{row.count}" if row.count > 1 else ""
        writes = isinstance(plan, WritePlanData)
        status = row.status.replace("load", "write") if writes else row.status
        info = f"{row.dtype}{row.shape}{count}  {format_bytes(row.nbytes)}  {status}"
        targets = list(row.targets)
        if len(row.sources) == 1 and len(targets) == 1:
            one = f"      {row.sources[0]} → {targets[0]}"
            if row.sources[0] == targets[0]:
                one = f"      {targets[0]}"
            if len(one) + len(info) + 2 <= width:
                lines.append(f"{one}  {info}")
                continue
        lines += [f"      {src}" for src in row.sources]
        lines += [f"    → {t}" for t in targets[:-1]]
        lines.append(f"    → {targets[-1]}  {info}")
    return lines


def total_lines(plan: PlanData) -> list[str]:
    steps = plan.schedule.steps
    read = plan.read_bytes
    direct = sum(r.nbytes for p in steps for r in p.reads if r.direct)
    peak = plan.schedule.peak
    at = f" at step {peak.event.step + 1}/{len(steps)} ({peak.label})" if peak else ""
    threads = plan.options.threads or "inline"
    if plan.options.threads and plan.schedule.threads != plan.options.threads:
        threads = f"{plan.options.threads} ({plan.schedule.threads} used: one per CPU)"
    lines = [
        f"reads: {format_bytes(read)} in {sum(len(p.reads) for p in steps)} reads, "
        f"{100 * direct / read if read else 100:.0f}% straight into "
        f"{'model memory' if plan.direction is Direction.LOAD else 'the output files'}; "
        f"{'model tensors' if plan.direction is Direction.LOAD else 'tensors'} written: "
        f"{format_bytes(plan.model_bytes)}",
        f"peak estimate: {format_bytes(plan.peak_bytes)}{at}; read-ahead window "
        f"{format_bytes(plan.schedule.window_bytes)}, threads: {threads}"
        + (f", budget {format_bytes(plan.options.budget)}" if plan.options.budget else ""),
    ]
    return lines


def problem_lines(plan: PlanData) -> list[str]:
    if not isinstance(plan, LoadPlanData) or not plan.problems:
        return ["problems: none"]
    lines = [f"problems: {len(plan.problems)}"]
    simple = {ProblemKind.MISSING: plan.missing, ProblemKind.UNEXPECTED: plan.unexpected}
    for kind, names in simple.items():
        if names:
            folded = fold_keys(names)
            lines.append(f"  {kind.value} ({len(names)}): " + ", ".join(folded[:MAX_LIST])
                         + (f", … {len(folded) - MAX_LIST} more" if len(folded) > MAX_LIST else ""))
    detailed = [p for p in plan.problems if p.kind not in simple]
    for p in detailed[:MAX_LIST]:
        lines.append(f"  {p.kind.value}: {p.message}")
    if len(detailed) > MAX_LIST:
        lines.append(f"  … {len(detailed) - MAX_LIST} more")
    return lines


def note_lines(plan: PlanData) -> list[str]:
    notes = plan.notes if isinstance(plan, (LoadPlanData, WritePlanData)) else ()
    if not notes:
        return []
    lines = [f"notes: {len(notes)}"]
    lines += [f"  {n.message}" for n in notes[:MAX_LIST]]
    if len(notes) > MAX_LIST:
        lines.append(f"  … {len(notes) - MAX_LIST} more")
    return lines
