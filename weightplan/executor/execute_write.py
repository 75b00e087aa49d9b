"""``WritePlan.execute()``: the file sink, the run, the report."""

from __future__ import annotations

from weightplan.executor.report import SaveReport
from weightplan.executor.run import run_plan
from weightplan.executor.writer import FileSink
from weightplan.planner.write.write_plan import WritePlanData


def execute_write(plan: WritePlanData, *, progress: bool | None = None) -> SaveReport:
    """Write ``plan``'s checkpoint; nothing is left behind if it fails."""
    sink = FileSink(plan.directory, plan.layout, plan.overwrite)
    stats = run_plan(plan.schedule, plan.checkpoint, sink, progress=progress,
                     description="writing")
    return SaveReport(plan.directory, plan.layout.names, plan.layout.total_bytes,
                      len(plan.layout.locations), stats.seconds, stats.peak_bytes,
                      plan.peak_bytes, stats.rss_peak_bytes, stats.threads)
