"""Execute a plan: walk its events, copy on a thread pool, write into a sink.

The executor decides nothing: the schedule's events say when each step's destinations
are opened and its reads queued (SUBMIT) and when its reads are awaited and its
materialized ops run (FINALIZE). Where bytes go is the sink's business: model tensors
(:class:`~weightplan.executor.sinks.ModelSink`) or output files
(:class:`~weightplan.executor.writer.FileSink`). Sinks commit only after every step
succeeded, so a failure leaves a meta model untouched and no half-written checkpoint.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from weightplan.errors import ExecutionError, WeightplanError
from weightplan.executor.memory import RssMeter, Tracker
from weightplan.executor.progress import LoadProgress, wants_progress
from weightplan.executor.reader import Reader
from weightplan.planner.tensors.geometry import Region, row_major_strides
from weightplan.planner.tensors.placement import Program, ReadTask
from weightplan.planner.tensors.schedule import EventKind


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
    handles: list
    futures: list[Future] = field(default_factory=list)
    held: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


@dataclass
class RunStats:
    """What one execution measured (the sink-specific report is built from it)."""

    seconds: float = 0.0
    read_seconds: float = 0.0
    convert_seconds: float = 0.0
    commit_seconds: float = 0.0
    peak_bytes: int = 0
    rss_peak_bytes: int | None = None
    threads: int = 0


class _Execution:
    def __init__(self, plan, sink, reader: Reader, pool, tracker: Tracker, progress):
        self.plan, self.sink, self.reader, self.pool = plan, sink, reader, pool
        self.tracker, self.progress = tracker, progress
        self.steps: dict[int, _Step] = {}
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
        handles = [self.sink.open(d) for d in program.destinations]
        self.tracker.add(program.dest_bytes + program.staged_bytes)
        step = self.steps[index] = _Step(handles)
        for task in program.reads:
            for piece in task.pieces:
                step.futures.append(self.pool.submit(self._read, program, step, task, piece))

    def finalize(self, index: int) -> None:
        program, step = self.plan.schedule.steps[index], self.steps.pop(index)
        for future in step.futures:
            future.result()
        if program.materialize:
            self._convert(program, step)
        for dest, handle in zip(program.destinations, step.handles):
            self.sink.close(dest, handle)
        self.tracker.sub(program.staged_bytes)
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
            streams = _run_ops(program, step)
            for i, out_stream in enumerate(program.outputs):
                for j, frags in enumerate(out_stream):
                    for f in frags:
                        src = streams[i][j][_slices(f.region)]
                        dest = program.destinations[f.target]
                        self.sink.write_view(step.handles[f.target], dest, f.view, src)
        finally:
            self.tracker.sub(program.convert_bytes + program.held_bytes)
            step.held.clear()
            self.convert_seconds += time.perf_counter() - start


def _run_ops(program: Program, step: _Step):
    conv = program.conversion
    streams = tuple(tuple(step.held[(i, j)] for j in range(len(s)))
                    for i, s in enumerate(conv.group.sources))
    for k, op in enumerate(program.materialize):
        try:
            streams = op.forward(streams)
        except Exception as e:
            raise ExecutionError(f"op #{k} {op!r} failed for {conv.label} (sources "
                                 f"{', '.join(e.key for e in conv.group.entries)}): {e}") from e
    return streams


def _read_task(run: _Execution, program: Program, step: _Step, task: ReadTask,
               piece: tuple[int, int]) -> None:
    if _read_straight(run, program, step, task, piece):
        return
    with _source(run, task, piece) as src:
        f = task.fragment
        if f is None:  # an input of materialized ops: keep a copy (released when they ran)
            run.tracker.add(task.tmp_bytes)
            step.held[task.source] = src.clone() if task.entry.file is not None else src
            return
        dest = program.destinations[f.target]
        if task.direct:
            offset = f.view.offset * dest.spec.dtype.itemsize + piece[0]
            run.sink.write_bytes(step.handles[f.target], dest, offset, src)
        else:
            run.sink.write_view(step.handles[f.target], dest, f.view, src)


def _read_straight(run: _Execution, program: Program, step: _Step, task: ReadTask,
                   piece: tuple[int, int]) -> bool:
    """A direct read of a cold file goes from the file straight into the destination's
    bytes (:meth:`Reader.read_into`); False when it can't (warm file, in-memory source,
    a sink without CPU bytes to read into)."""
    f, entry = task.fragment, task.entry
    if not task.direct or f is None or entry.file is None or not run.reader.is_cold(entry.file):
        return False
    byte_view = getattr(run.sink, "byte_view", None)
    dest = program.destinations[f.target]
    offset = f.view.offset * dest.spec.dtype.itemsize + piece[0]
    target = byte_view(step.handles[f.target], dest, offset, piece[1]) if byte_view else None
    if target is None:
        return False
    run.reader.read_into(entry.file, task.byte_range[0] + piece[0], target)
    return True


class _source:
    """One piece of a read: its raw bytes when the read is direct, else the typed region
    (strided into a mapped file window, or a view of the in-memory tensor)."""

    def __init__(self, run: _Execution, task: ReadTask, piece: tuple[int, int]):
        self.run, self.task, self.piece = run, task, piece
        self._window = None

    def __enter__(self) -> torch.Tensor:
        task, (start, length) = self.task, self.piece
        entry = task.entry
        if entry.file is None:
            tensor = self.run.plan.checkpoint.tensors[entry.key]
            if not task.direct:
                return tensor[_slices(task.region)]
            first = task.byte_range[0] + start
            return _flat_bytes(tensor)[first:first + length]
        self._window = self.run.reader.window(entry.file, task.byte_range[0] + start, length)
        self.run.tracker.add(length)
        raw = self._window.__enter__()
        if task.direct:
            return raw
        return torch.as_strided(raw.view(entry.spec.dtype), task.region.shape,
                                row_major_strides(entry.spec.shape), 0)

    def __exit__(self, *exc) -> None:
        if self._window is not None:
            self._window.__exit__(*exc)
            self.run.tracker.sub(self.piece[1])


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1) if tensor.dim() else tensor.detach().reshape(1)
    return flat.view(torch.uint8)


def _slices(region: Region) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(region.starts, region.stops))


def run_plan(plan, sink, *, progress: bool | None, description: str = "loading") -> RunStats:
    """Execute ``plan`` into ``sink``; the sink commits only when every step succeeded."""
    meter, tracker = RssMeter(), Tracker()
    started = time.perf_counter()
    threads = plan.schedule.threads
    pool = ThreadPoolExecutor(threads, thread_name_prefix="weightplan") if threads else _InlinePool()
    bar = LoadProgress(plan.read_bytes, wants_progress(progress), description)
    try:
        with Reader(plan.checkpoint) as reader, bar:
            run = _Execution(plan, sink, reader, pool, tracker, bar)
            run.run()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        sink.abort()
        raise
    pool.shutdown(wait=True)
    commit_start = time.perf_counter()
    sink.commit()
    now = time.perf_counter()
    return RunStats(now - started, run.read_seconds, run.convert_seconds, now - commit_start,
                    tracker.peak, meter.peak_growth(), threads)
