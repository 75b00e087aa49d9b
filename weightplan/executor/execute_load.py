"""``plan.execute()`` for load plans: checks, the model sink, the report."""

from __future__ import annotations

import warnings

from torch import nn

from weightplan.errors import PlanError, QuantizationError, ShapeMismatchError, StrictLoadError
from weightplan.executor.report import LoadReport
from weightplan.executor.run import run_plan
from weightplan.executor.model_sink import ModelSink, check_unchanged
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.plan import LoadPlanData
from weightplan.planner.write.record import attach_record, get_record, merge_records, record_from_plan


def execute_plan(plan: LoadPlanData, *, strict: bool = False, progress: bool | None = None
                 ) -> LoadReport:
    """Run a load plan (see :meth:`weightplan.Plan.execute`)."""
    model, info = preflight(plan, strict)
    sink = ModelSink(model, info, sorted(plan.missing), initialize=not strict)
    stats = run_plan(plan.schedule, plan.checkpoint, sink, progress=progress)
    attach_record(model, merge_records(get_record(model), record_from_plan(plan)))
    if plan.missing or plan.unexpected:
        warnings.warn(f"weightplan: {len(plan.missing)} missing tensor(s) "
                      f"{_some(plan.missing)} ({len(sink.initialized)} initialized fresh) and "
                      f"{len(plan.unexpected)} unexpected checkpoint key(s) "
                      f"{_some(plan.unexpected)} not loaded", stacklevel=3)
    return LoadReport(
        bytes_read=plan.read_bytes,
        bytes_needed=sum(p.needed_bytes for p in plan.schedule.steps),
        seconds=stats.seconds, peak_bytes=stats.peak_bytes, planned_peak_bytes=plan.peak_bytes,
        rss_peak_bytes=stats.rss_peak_bytes, tensors_loaded=len(sink.results),
        threads=stats.threads,
        stage_seconds={"read": stats.read_seconds, "convert": stats.convert_seconds,
                       "assign": stats.commit_seconds},
        missing=plan.missing, unexpected=plan.unexpected, initialized=sink.initialized)


def preflight(plan: LoadPlanData, strict: bool) -> tuple[nn.Module, ModelInfo]:
    """Everything that can fail before a byte is written fails here."""
    if plan.model is None or plan.model_info is None:
        raise PlanError("this plan has no model to load into; pass one to explain()")
    if plan.mismatched:
        details = "; ".join(p.message for p in plan.problems if p.kind.value == "mismatch")
        raise ShapeMismatchError(f"{len(plan.mismatched)} tensor(s) don't fit the model, nothing "
                                 f"was loaded: {details}")
    fp8 = [p for p in plan.problems if p.kind.value == "quantization"]
    if fp8:
        raise QuantizationError(f"{len(fp8)} FP8 problem(s), nothing was loaded: "
                                + "; ".join(p.message for p in fp8[:5]))
    if strict and (plan.missing or plan.unexpected):
        raise StrictLoadError(f"strict load: {len(plan.missing)} missing "
                              f"({', '.join(sorted(plan.missing)[:5])}) and "
                              f"{len(plan.unexpected)} unexpected "
                              f"({', '.join(sorted(plan.unexpected)[:5])}); nothing was loaded")
    for program in plan.schedule.steps:
        for dest in program.destinations:
            check_unchanged(plan.model, dest)
    return plan.model, plan.model_info


def _some(names: frozenset[str]) -> str:
    shown = sorted(names)[:3]
    return f"[{', '.join(shown)}{', ...' if len(names) > 3 else ''}]" if names else ""
