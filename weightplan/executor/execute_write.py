"""``WritePlan.execute()``: the file sink, the run, the report."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from weightplan.executor.gather import DiscardSink, barrier, gathering, has_dtensors, writer_rank
from weightplan.executor.report import SaveReport
from weightplan.executor.sink import Sink
from weightplan.executor.run import run_plan
from weightplan.executor.writer import FileSink
from weightplan.planner.pipelines.write_plan import WritePlanData


def execute_write(plan: WritePlanData, *, progress: bool | None = None,
                  files: Mapping[str, bytes] | None = None) -> SaveReport:
    """Write ``plan``'s checkpoint, and ``files`` (the model's config, ``{name: bytes}``) in
    the same commit; nothing is left behind if it fails. A tensor-parallel model is
    gathered tensor by tensor on every rank and written by rank 0
    (:mod:`~weightplan.executor.gather`)."""
    schedule, checkpoint, writes = plan.schedule, plan.checkpoint, True
    sharded = has_dtensors(checkpoint)
    if sharded:  # same collectives in the same order on every rank
        _, writes = writer_rank()
        schedule, checkpoint = dataclasses.replace(schedule, threads=0), gathering(checkpoint)
    sink: Sink = (FileSink(plan.directory, plan.layout, plan.overwrite, files) if writes
                  else DiscardSink())
    stats = run_plan(schedule, checkpoint, sink, progress=progress, description="writing")
    if sharded and writer_rank()[0]:
        barrier()
    names = plan.layout.names + tuple(files or ())  # the configs are committed with them
    return SaveReport(plan.directory, names, plan.layout.total_bytes, len(plan.layout.locations),
                      stats.seconds, stats.peak_bytes, plan.peak_bytes, stats.rss_peak_bytes,
                      stats.threads)
