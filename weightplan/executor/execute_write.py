"""``WritePlan.execute()``: the file sink, the run, the report."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from weightplan.executor.gather import (
    DiscardSink, GatheringWriter, gathering, has_dtensors, save_roles,
)
from weightplan.executor.report import SaveReport
from weightplan.executor.save_agreement import agree_done, agree_on_plan
from weightplan.executor.sink import Sink
from weightplan.executor.run import RunStats, run_plan
from weightplan.executor.writer import FileSink
from weightplan.planner.pipelines.agreement import Agreement
from weightplan.planner.pipelines.write_plan import WritePlanData


def execute_write(plan: WritePlanData, *, progress: bool | None = None,
                  files: Mapping[str, bytes] | None = None,
                  process_group: Any = None) -> SaveReport:
    """Write ``plan``'s checkpoint, and ``files`` (the model's config, ``{name: bytes}``) in
    the same commit; nothing is left behind if it fails. A tensor-parallel model is
    gathered tensor by tensor on the writer's TP group and written by the first rank of
    ``process_group`` (by default the world): :mod:`~weightplan.executor.gather`."""
    schedule, checkpoint = plan.schedule, plan.checkpoint
    roles = save_roles(checkpoint, process_group)
    agree_on_plan(roles.group, plan, _writer(roles.group))  # (before any gather or write)
    gathers = has_dtensors(checkpoint)
    if gathers:  # same collectives in the same order on every rank
        schedule, checkpoint = dataclasses.replace(schedule, threads=0), gathering(checkpoint)
    with _agreement(roles.group, "to start the save (its writer to take the directory)") as start:
        roles.check()
        sink: Sink = (FileSink(plan.directory, plan.layout, plan.overwrite, files)
                      if roles.writes else DiscardSink())
        if gathers and roles.writes:  # (a failed write: the gathers go on, see gather.py)
            sink = GatheringWriter(sink)
        try:
            start.agree()
        except BaseException:
            sink.abort()
            raise
    done = _agreement(roles.group, "to write and commit the checkpoint")
    try:
        stats = (run_plan(schedule, checkpoint, sink, progress=progress, description="writing")
                 if roles.runs else RunStats())
    except Exception as e:
        agree_done(done, plan.directory, e, committed=False)
        raise
    agree_done(done, plan.directory, None, committed=roles.writes)
    names = plan.layout.names + tuple(files or ())  # the configs are committed with them
    return SaveReport(plan.directory, names, plan.layout.total_bytes, len(plan.layout.locations),
                      stats.seconds, stats.peak_bytes, plan.peak_bytes, stats.rss_peak_bytes,
                      stats.threads)


def _writer(group: Any) -> int:
    import torch.distributed as dist

    return 0 if group is None else dist.get_global_rank(group, 0)


def _agreement(group: object, stage: str) -> Agreement:
    return Agreement(group, stage, work="save", instead="waiting for its writer",
                     gone="a rank left the process group, or never called save? One "
                          "data-parallel replica saving alone passes process_group=")
