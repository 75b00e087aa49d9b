"""``plan.execute()`` for load plans: checks, the model sink, the report."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from torch import nn

from weightplan.errors import (
    AdapterError, LossyCastError, MetaBufferError, PlanError, QuantizationError, ShapeMismatchError,
    StrictLoadError,
)
from weightplan.executor.atomic import GuardedSink, partial_load_errors
from weightplan.executor.report import LoadReport
from weightplan.executor.run import run_plan
from weightplan.executor.init_fit import check_allocations_fit, fresh_sizes
from weightplan.executor.model_check import check_separate, check_unchanged
from weightplan.executor.model_sink import ModelSink
from weightplan.planner.core.problems import ProblemKind
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.write.record import attach_record, get_record, merge_records, record_of_conversions
from weightplan.units import agreeing, counted

if TYPE_CHECKING:  # (a protocol, and what a cooperative load imports: annotations only)
    from weightplan.planner.inputs.device import StagingPool
    from weightplan.executor.sink import Sink
    from weightplan.planner.pipelines.agreement import Agreement

log = logging.getLogger("weightplan")


def execute_plan(plan: LoadPlanData, *, strict: bool = False, progress: bool | None = None,
                 atomic: bool = False) -> LoadReport:
    """Run a load plan (see :meth:`weightplan.Plan.execute`). The ranks of a cooperative
    load agree before the broadcasts (:mod:`~weightplan.planner.pipelines.agreement`):
    a rank that fails before them makes the others raise instead of waiting for it."""
    agreement, ties = _agreement(plan), _ties_agreement(plan)
    with contextlib.ExitStack() as points:  # (a failure is told at the first point left)
        for point in (agreement, ties):
            if point is not None:
                points.enter_context(point)
        return _execute(plan, strict, progress, atomic, agreement, ties)


def _execute(plan: LoadPlanData, strict: bool, progress: bool | None, atomic: bool,
             agreement: Agreement | None, ties: Agreement | None = None) -> LoadReport:
    model, info = preflight(plan, strict)
    mesh = None
    if plan.sharding is not None:  # (tensor parallel: its modules only then)
        from weightplan.executor.dtensors import check_output
        from weightplan.executor.exchange import check_exchange

        check_output(plan.sharding)
        mesh = plan.sharding.mesh
        check_exchange(plan.exchange, mesh)
    fresh = sorted(plan.missing | plan.findings.ignored_missing)
    # before a byte is read or allocated: see executor/init_fit.py
    check_allocations_fit(fresh_sizes(model, info, fresh, plan.options.dtype),
                          (d for p in plan.schedule.steps for d in p.destinations),
                          plan.options.devices)
    offload = plan.options.placement.offload if plan.options.placement is not None else None
    inner = ModelSink(model, info, fresh, initialize=True, dtype=plan.options.dtype,
                      devices=plan.options.devices, sharding=plan.sharding,
                      offload=offload,
                      staging=_staging(plan))
    sink = GuardedSink(inner, atomic=atomic)  # see executor/atomic.py
    with partial_load_errors(sink):
        shared = _exchanged(sink, plan, mesh, agreement)
        stats = run_plan(plan.schedule, plan.checkpoint, shared, progress=progress)
    _after_load(plan, model, info, inner, ties)
    record = record_of_conversions(plan.conversions, plan.checkpoint, plan.unexpected,
                                   plan.adapter.merged_as() if plan.adapter else None)
    attach_record(model, merge_records(get_record(model), record))
    if plan.adapter is not None:  # (its config goes back with it when saved)
        from weightplan.planner.pipelines.adapter_summary import remember_adapter

        remember_adapter(model, plan.adapter)
    _warn_unloaded(plan, len(sink.initialized))
    return LoadReport(
        bytes_read=plan.read_bytes,
        bytes_needed=sum(p.needed_bytes for p in plan.schedule.steps),
        seconds=stats.seconds, peak_bytes=stats.peak_bytes, planned_peak_bytes=plan.peak_bytes,
        rss_peak_bytes=stats.rss_peak_bytes, tensors_loaded=len(sink.results),
        threads=stats.threads,
        stage_seconds={"read": stats.read_seconds, "convert": stats.convert_seconds,
                       "assign": stats.commit_seconds},
        missing=plan.missing, unexpected=plan.unexpected, initialized=sink.initialized,
        offloaded={**_referenced(plan), **inner.offloaded},
        device_bytes=_with_referenced(inner.device_bytes(), plan),
        staging_bytes=inner.staging_bytes, offload_written_bytes=inner.disk_bytes)


def _after_load(plan: LoadPlanData, model: nn.Module, info: ModelInfo, sink: ModelSink,
                ties: Agreement | None) -> None:
    """What the plan settles once every tensor is loaded: ties (``ties``: the ranks'
    agreement before comparing them under TP), trainable tokens' rows."""
    if info.stored_ties:  # (loaded apart: tied again where equal, see executor/retie.py)
        from weightplan.executor.retie import settle_stored_ties

        settle_stored_ties(model, info, sharding=plan.sharding, disk=_on_disk(plan, sink),
                           agreement=ties)
    if plan.adapter is not None and plan.adapter.tokens:  # (peft's trainable tokens)
        from weightplan.executor.token_rows import fill_token_rows

        fill_token_rows(model, plan.adapter.tokens)


def _warn_unloaded(plan: LoadPlanData, initialized: int) -> None:
    """A lenient load's missing and unexpected tensors, said once as a warning."""
    if plan.missing or plan.unexpected:
        said = [f"{counted(len(plan.missing), 'missing tensor')} {_some(plan.missing)} "
                f"({initialized} initialized by the model's own init)"] \
            if plan.missing else []
        said += [f"{counted(len(plan.unexpected), 'unexpected checkpoint key')} "
                 f"{_some(plan.unexpected)} not loaded"] if plan.unexpected else []
        log.warning("%s", " and ".join(said))


def _staging(plan: LoadPlanData) -> StagingPool | None:
    """The plan's pinned pool for its CUDA copies (``None``: nothing goes to CUDA)."""
    devices = plan.options.devices
    if devices is None or not devices.uses_cuda:
        return None
    from weightplan.planner.tensors.schedule.device_plan import staging_of  # (CUDA only)

    return staging_of(plan.schedule.steps, devices)


def _on_disk(plan: LoadPlanData, sink: ModelSink) -> dict[str, tuple[str, str]]:
    """Offloaded tensors: name (every alias) → (safetensors file, its key there)."""
    placement = plan.options.placement
    offload = placement.offload if placement is not None else None
    found = {} if offload is None else {n: (e["safetensors_file"], e["weight_name"])
                                        for n, e in offload.index().items()}
    found.update((n, (path, os.path.basename(path).removesuffix(".safetensors")))
                 for n, path in sink.offloaded.items())  # (written: one file per tensor)
    return found


def _referenced(plan: LoadPlanData) -> dict[str, str]:
    """Offloaded tensors the plan reads in place: name (every alias) → checkpoint file."""
    placement = plan.options.placement
    offload = placement.offload if placement is not None else None
    return {} if offload is None else {n: e["safetensors_file"]
                                       for n, e in offload.index().items()}


def _with_referenced(per: dict[str, int], plan: LoadPlanData) -> dict[str, int]:
    """Bytes per device, the disk's counting the tensors left in the checkpoint too."""
    placement = plan.options.placement
    offload = placement.offload if placement is not None else None
    if offload is not None and offload.referenced_bytes:
        per["disk"] = per.get("disk", 0) + offload.referenced_bytes
    return per


def preflight(plan: LoadPlanData, strict: bool) -> tuple[nn.Module, ModelInfo]:
    """Everything that can fail before a byte is written fails here."""
    if plan.model is None or plan.model_info is None:
        raise PlanError("this plan has no model to load into; pass one to explain()")
    placement = plan.options.placement
    if placement is not None and placement.absent:
        raise PlanError(f"this plan places tensors on {', '.join(placement.absent)}, which "
                        "this machine doesn't have (a dry run: it explains, it doesn't load); "
                        "explain() again with this machine's devices in max_memory")
    if plan.mismatched:
        details = "; ".join(p.message for p in plan.problems if p.kind is ProblemKind.MISMATCH)
        fit = agreeing(len(plan.mismatched), "doesn't", "don't")
        raise ShapeMismatchError(f"{counted(len(plan.mismatched), 'tensor')} {fit} fit the "
                                 f"model, nothing was loaded: {details}")
    lossy = [p for p in plan.problems if p.kind is ProblemKind.LOSSY_CAST]
    if lossy:
        raise LossyCastError(f"{counted(len(lossy), 'tensor')} would lose values in a cast, "
                             "nothing was loaded: " + "; ".join(p.message for p in lossy[:5]))
    refuse_adapter_problems(plan)
    fp8 = [p for p in plan.problems if p.kind is ProblemKind.QUANTIZATION]
    if fp8:
        raise QuantizationError(f"{counted(len(fp8), 'FP8 problem')}, nothing was loaded: "
                                + "; ".join(p.message for p in fp8[:5]))
    if strict and (plan.missing or plan.unexpected):
        found = [f"{len(keys)} {what} {_some(keys)}" for what, keys
                 in (("missing", plan.missing), ("unexpected", plan.unexpected)) if keys]
        raise StrictLoadError(f"strict load: {' and '.join(found)}; nothing was loaded")
    refuse_meta_buffers(plan)
    info = plan.model_info
    for program in plan.schedule.steps:  # as planned: see executor/model_check.py
        for dest in program.destinations:
            check_unchanged(plan.model, dest, info.get(dest.key))
    check_separate(plan.model, (d for p in plan.schedule.steps for d in p.destinations))
    return plan.model, plan.model_info


def refuse_adapter_problems(plan: LoadPlanData) -> None:
    """An adapter that would load partly, or scaled wrong, gives a silently wrong model."""
    wrong = [p for p in plan.problems if p.kind is ProblemKind.ADAPTER]
    if wrong:
        raise AdapterError(f"{counted(len(wrong), 'adapter problem')}, nothing was loaded: "
                           + "; ".join(p.message for p in wrong[:5]))


def refuse_meta_buffers(plan: LoadPlanData) -> None:
    """Buffers left on meta that nothing rebuilds would fail (or give NaN) later: refuse."""
    stuck = [p.key for p in plan.problems if p.kind is ProblemKind.META_BUFFER]
    if stuck:
        raise MetaBufferError(f"{counted(len(stuck), 'non-persistent buffer')} "
                              f"{agreeing(len(stuck), 'is', 'are')} on the meta device and "
                              f"nothing can rebuild them: {', '.join(stuck[:8])}; build the model "
                              "under weightplan.init_empty() (buffers stay real) or give them "
                              "real values before execute(); nothing was loaded")


def _exchanged(sink: Sink, plan: LoadPlanData, mesh: object, agreement: Agreement | None
               ) -> Sink:
    """Cooperative reads: the sink that broadcasts before the commit, else ``sink``."""
    if plan.exchange is None or not plan.exchange.items:
        return sink
    from weightplan.executor.exchange import ExchangeSink

    return ExchangeSink(sink, plan.exchange, mesh, agreement)


def _agreement(plan: LoadPlanData) -> Agreement | None:
    """Where a cooperative load on a process group agrees (none for other loads)."""
    sharding = plan.sharding
    if plan.exchange is None or not plan.exchange.items or sharding is None \
            or sharding.mesh is None:
        return None
    from weightplan.planner.pipelines.agreement import Agreement

    return Agreement(sharding.mesh.get_group(), "to read its part")


def _ties_agreement(plan: LoadPlanData) -> Agreement | None:
    """Where the ranks of a tensor-parallel load agree before they compare the ties the
    checkpoint stores both names of (see executor/retie.py): a rank that failed would
    leave the others in the comparison's ``all_reduce``."""
    sharding, info = plan.sharding, plan.model_info
    if sharding is None or sharding.mesh is None or info is None or not info.stored_ties:
        return None
    from weightplan.planner.pipelines.agreement import Agreement

    return Agreement(sharding.mesh.get_group(), "before comparing the ties stored apart",
                     work="tensor-parallel load", instead="waiting to compare them")


def _some(names: frozenset[str]) -> str:
    from weightplan.terminal import terminal_text  # (a warning's: a clean load doesn't need it)

    shown = [terminal_text(n) for n in sorted(names)[:3]]  # (keys come from the file)
    more = f", … {len(names) - 3} more" if len(names) > 3 else ""
    return f"[{', '.join(shown)}{more}]"
