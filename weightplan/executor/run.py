"""Execute a plan: walk its events, read on a thread pool, write into destinations.

The executor decides nothing: the schedule's events say when each step's destinations
are allocated and its reads queued (SUBMIT) and when its reads are awaited and its
materialized ops run (FINALIZE). Loaded tensors are installed into a meta model only
after every step succeeded, so a failure leaves such a model untouched.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from weightplan.errors import (
    ExecutionError, PlanError, ShapeMismatchError, StrictLoadError, WeightplanError,
)
from weightplan.executor.memory import RssMeter, Tracker
from weightplan.executor.progress import LoadProgress, wants_progress
from weightplan.executor.reader import Reader
from weightplan.executor.report import LoadReport
from weightplan.executor.sinks import (
    check_unchanged, destination_tensor, initialize_missing, install,
)
from weightplan.planner.geometry import Region, View, row_major_strides
from weightplan.planner.placement import Program, ReadTask
from weightplan.planner.schedule import EventKind

class _InlinePool:
    """``threads=0``: every task runs when submitted."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as e:
            future.set_exception(e)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


@dataclass
class _Step:
    dests: list[torch.Tensor]
    futures: list[Future] = field(default_factory=list)
    held: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


class _Execution:
    def __init__(self, plan, reader: Reader, pool, tracker: Tracker, progress: LoadProgress):
        self.plan, self.reader, self.pool = plan, reader, pool
        self.tracker, self.progress = tracker, progress
        self.steps: dict[int, _Step] = {}
        self.results: dict[str, torch.Tensor] = {}
        self.read_seconds = 0.0
        self.convert_seconds = 0.0
        self._lock = threading.Lock()

    def run(self) -> None:
        for event in self.plan.schedule.events:
            if event.kind is EventKind.SUBMIT:
                self.submit(event.step)
            else:
                self.finalize(event.step)

    def submit(self, index: int) -> None:
        program = self.plan.schedule.steps[index]
        dests = [destination_tensor(self.plan.model, d) for d in program.destinations]
        self.tracker.add(program.dest_bytes)
        step = self.steps[index] = _Step(dests)
        for task in program.reads:
            for piece in task.pieces:
                step.futures.append(self.pool.submit(self._read, program, step, task, piece))

    def finalize(self, index: int) -> None:
        program, step = self.plan.schedule.steps[index], self.steps.pop(index)
        for future in step.futures:
            future.result()
        if program.materialize:
            self._convert(program, step)
        for dest, tensor in zip(program.destinations, step.dests):
            self.results[dest.key] = tensor
        self.progress.advance(program.read_bytes)

    def _read(self, program: Program, step: _Step, task: ReadTask, piece: tuple[int, int]):
        start = time.perf_counter()
        try:
            _read_task(self, program, step, task, piece)
        except WeightplanError:
            raise
        except Exception as e:
            raise ExecutionError(f"while reading {task.entry.key} from "
                                 f"{task.entry.file or '<memory>'} for "
                                 f"{program.conversion.label}: {e}") from e
        finally:
            with self._lock:
                self.read_seconds += time.perf_counter() - start

    def _convert(self, program: Program, step: _Step) -> None:
        start = time.perf_counter()
        self.tracker.add(program.convert_bytes)
        try:
            conv = program.conversion
            streams = tuple(tuple(step.held[(i, j)] for j in range(len(s)))
                            for i, s in enumerate(conv.group.sources))
            for k, op in enumerate(program.materialize):
                try:
                    streams = op.forward(streams)
                except Exception as e:
                    raise ExecutionError(f"op #{k} {op!r} failed for {conv.label} "
                                         f"(sources {', '.join(e.key for e in conv.group.entries)}): "
                                         f"{e}") from e
            with torch.no_grad():
                for i, out_stream in enumerate(program.outputs):
                    for j, frags in enumerate(out_stream):
                        for f in frags:
                            src = streams[i][j][_slices(f.region)]
                            _view(step.dests[f.target], f.view).copy_(src.reshape(f.view.shape))
        finally:
            self.tracker.sub(program.convert_bytes + program.held_bytes)
            step.held.clear()
            self.convert_seconds += time.perf_counter() - start


def _read_task(run: _Execution, program: Program, step: _Step, task: ReadTask,
               piece: tuple[int, int]) -> None:
    entry, f = task.entry, task.fragment
    if entry.file is None:
        _copy_from_memory(run, step, task)
        return
    offset = task.byte_range[0] + piece[0]
    with run.reader.window(entry.file, offset, piece[1]) as raw, run.tracker.holding(piece[1]):
        if task.direct:
            base = step.dests[f.target]
            start = f.view.offset * base.element_size() + piece[0]
            _bytes_of(base)[start:start + piece[1]].copy_(raw)
            return
        src = torch.as_strided(raw.view(entry.spec.dtype), task.region.shape,
                               row_major_strides(entry.spec.shape), 0)
        if f is None:  # an input of materialized ops: keep a copy (released when they ran)
            run.tracker.add(piece[1])
            step.held[task.source] = src.clone()
            return
        with torch.no_grad():
            _view(step.dests[f.target], f.view).copy_(src.reshape(f.view.shape))


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The flat ``uint8`` storage of a contiguous destination (starting at its offset)."""
    flat = tensor.detach().reshape(-1) if tensor.dim() else tensor.detach().reshape(1)
    return flat.view(torch.uint8)


def _copy_from_memory(run: _Execution, step: _Step, task: ReadTask) -> None:
    tensor = run.plan.checkpoint.tensors[task.entry.key]
    src = tensor[_slices(task.region)]
    if task.fragment is None:
        step.held[task.source] = src
        return
    f = task.fragment
    with torch.no_grad():
        _view(step.dests[f.target], f.view).copy_(src.reshape(f.view.shape))


def _slices(region: Region) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(region.starts, region.stops))


def _view(base: torch.Tensor, view: View) -> torch.Tensor:
    return torch.as_strided(base, view.shape, view.stride, base.storage_offset() + view.offset)


def execute_plan(plan, *, strict: bool = False, progress: bool | None = None) -> LoadReport:
    """Run ``plan`` (see :meth:`Plan.execute`)."""
    _preflight(plan, strict)
    meter, tracker = RssMeter(), Tracker()
    started = time.perf_counter()
    threads = workers(plan.options.threads)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="weightplan") if threads else _InlinePool()
    bar = LoadProgress(plan.read_bytes, wants_progress(progress))
    try:
        with Reader(plan.checkpoint) as reader, bar:
            run = _Execution(plan, reader, pool, tracker, bar)
            run.run()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assign_start = time.perf_counter()
    initialized = _finish(plan, run.results, strict)
    seconds = time.perf_counter() - started
    return LoadReport(
        bytes_read=plan.read_bytes,
        bytes_needed=sum(p.needed_bytes for p in plan.schedule.steps),
        seconds=seconds, peak_bytes=tracker.peak, planned_peak_bytes=plan.peak_bytes,
        rss_peak_bytes=meter.peak_growth(), tensors_loaded=len(run.results), threads=threads,
        stage_seconds={"read": run.read_seconds, "convert": run.convert_seconds,
                       "assign": time.perf_counter() - assign_start},
        missing=plan.missing, unexpected=plan.unexpected, initialized=initialized)


def workers(threads: int) -> int:
    """Copies out of the page cache are CPU-bound: never more workers than CPUs."""
    return min(threads, os.cpu_count() or 1)


def _preflight(plan, strict: bool) -> None:
    """Everything that can fail before a byte is written fails here."""
    if plan.model is None:
        raise PlanError("this plan has no model to load into; pass one to explain()")
    if plan.mismatched:
        details = "; ".join(p.message for p in plan.problems if p.kind.value == "mismatch")
        raise ShapeMismatchError(f"{len(plan.mismatched)} tensor(s) don't fit the model, nothing "
                                 f"was loaded: {details}")
    if strict and (plan.missing or plan.unexpected):
        raise StrictLoadError(f"strict load: {len(plan.missing)} missing "
                              f"({', '.join(sorted(plan.missing)[:5])}) and "
                              f"{len(plan.unexpected)} unexpected "
                              f"({', '.join(sorted(plan.unexpected)[:5])}); nothing was loaded")
    for program in plan.schedule.steps:
        for dest in program.destinations:
            check_unchanged(plan.model, dest)


def _finish(plan, results: dict[str, torch.Tensor], strict: bool) -> dict[str, str]:
    info = plan.model_info
    missing = [info.get(name) for name in sorted(plan.missing)]
    initialized = initialize_missing(plan.model, missing) if not strict else {}
    for program in plan.schedule.steps:
        for dest in program.destinations:
            install(plan.model, dest, results[dest.key], info.get(dest.key))
    if plan.missing or plan.unexpected:
        warnings.warn(f"weightplan: {len(plan.missing)} missing tensor(s) "
                      f"{_some(plan.missing)} ({len(initialized)} initialized fresh) and "
                      f"{len(plan.unexpected)} unexpected checkpoint key(s) "
                      f"{_some(plan.unexpected)} not loaded", stacklevel=4)
    return initialized


def _some(names: frozenset[str]) -> str:
    shown = sorted(names)[:3]
    return f"[{', '.join(shown)}{', ...' if len(names) > 3 else ''}]" if names else ""
