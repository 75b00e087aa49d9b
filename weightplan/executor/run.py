"""Execute a plan: walk its events, copy on a thread pool, write into a sink.

The executor decides nothing: the schedule's events say when each step's destinations
are opened and its reads queued (SUBMIT) and when its reads are awaited and its
materialized op nodes run (FINALIZE). The steps are the verified lowering of the plan's
graph (:mod:`weightplan.planner.tensors.lower.placement`). Where bytes go is the sink's
business (:class:`~weightplan.executor.sink.Sink`): model tensors
(:class:`~weightplan.executor.model_sink.ModelSink`), output files
(:class:`~weightplan.executor.writer.FileSink`) or a dict
(:class:`~weightplan.executor.dict_sink.DictSink`). Sinks commit only after every step
succeeded, so a failure leaves a meta model untouched and no half-written checkpoint.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from weightplan.errors import ExecutionError, WeightplanError
from weightplan.executor.memory import RssMeter, Tracker
from weightplan.executor.progress import LoadProgress, wants_progress
from weightplan.executor.reader import Reader
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.core.geometry import Region, row_major_strides
from weightplan.planner.core.ops.base import Streams
from weightplan.planner.tensors.lower.placement import ReadTask, Step
from weightplan.planner.tensors.schedule.schedule import Schedule

if TYPE_CHECKING:  # (a protocol: annotations only)
    from weightplan.executor.sink import Sink


class _InlinePool(Executor):
    """``threads=0``: every task runs when submitted."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:
            future.set_exception(e)
        return future


@dataclass
class _Step:
    handles: list[Any]
    futures: list[Future] = field(default_factory=list)
    held: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


@dataclass
class _Updating:
    """An in-place step whose pieces run on the pool (``pieces``: the task queueing them)."""

    program: Step
    step: _Step
    start: float
    pieces: Future | None = None


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
    def __init__(self, schedule: Schedule, checkpoint: Checkpoint, sink: Sink, reader: Reader,
                 pool: Executor, tracker: Tracker, progress: LoadProgress):
        self.schedule, self.checkpoint = schedule, checkpoint
        self.sink, self.reader, self.pool = sink, reader, pool
        self.tracker, self.progress = tracker, progress
        self.steps: dict[int, _Step] = {}
        self.local = threading.local()  # per reader thread: the dequantize workspace
        self.read_seconds = 0.0
        self.convert_seconds = 0.0
        self._lock = threading.Lock()
        self.updating: _Updating | None = None  # the last in-place step, its pieces running

    def run(self) -> None:
        events = self.schedule.events  # (columns: no Event object per event)
        for step, finalize in zip(events.steps, events.finalizes, strict=True):
            if finalize:
                self.finalize(step)
            else:
                self.submit(step)
        self._updated()

    def submit(self, index: int) -> None:
        program = self.schedule.steps[index]
        handles = [self.sink.open(d) for d in program.destinations]
        self.tracker.add(program.dest_bytes + program.staged_bytes)
        step = self.steps[index] = _Step(handles)
        for task in program.reads:
            for piece in task.pieces:
                step.futures.append(self.pool.submit(self._read, program, step, task, piece))

    def finalize(self, index: int) -> None:
        """The step's reads awaited, its ops run, its destinations closed; an in-place
        step's update is started instead, and the previous one's awaited (see
        :meth:`_update`)."""
        program, step = self.schedule.steps[index], self.steps.pop(index)
        for future in step.futures:
            future.result()
        if program.in_place:
            started = self._update(program, step)
            self._updated()
            self.updating = started
            return
        self._updated()
        if program.materialize or program.quantized:
            self._convert(program, step)
        self._close(program, step)

    def _close(self, program: Step, step: _Step) -> None:
        for dest, handle in zip(program.destinations, step.handles, strict=True):
            self.sink.close(dest, handle)
        self.tracker.sub(program.staged_bytes)

    def _read(self, program: Step, step: _Step, task: ReadTask, piece: tuple[int, int]) -> None:
        start = time.perf_counter()
        try:
            _read_task(self, program, step, task, piece)
        except WeightplanError:
            raise
        except Exception as e:
            raise ExecutionError(f"while reading {task.entry.key} from "
                                 f"{task.entry.file or '<memory>'} for "
                                 f"{program.label}: {e}") from e
        finally:
            with self._lock:
                self.read_seconds += time.perf_counter() - start
        runs = task.layout.runs
        # per read, from the reader thread (thread-safe)
        self.progress.advance(piece[1] if runs is None else runs.nbytes)

    def _convert(self, program: Step, step: _Step) -> None:
        start = time.perf_counter()
        self.tracker.add(program.convert_bytes)
        try:
            streams = (self.pool.submit(_no_grad, _run_ops, program, step).result()
                       if _merges(program.in_place, program.ops) else _run_ops(program, step))  # (_pool)
            for i, out_stream in enumerate(program.outputs):
                for j, frags in enumerate(out_stream):
                    for f in frags:
                        src = streams[i][j][_slices(f.region)]
                        dest = program.destinations[f.target]
                        self.sink.write_view(step.handles[f.target], dest, f.view, src)
            if program.quantized:  # (saving FP8: the quantize kernels only then)
                from weightplan.executor.dequant import quantize_write
            for task in program.quantized:
                quantize_write(self.sink, program, step.handles, task, streams)
        finally:
            self.tracker.sub(program.convert_bytes + program.held_bytes)
            step.held.clear()
            self.convert_seconds += time.perf_counter() - start

    def _update(self, program: Step, step: _Step) -> _Updating:
        """Start the step's op finishing its outputs where its reads landed
        (``Step.in_place``), from the held reads (``None`` at the positions read into the
        destinations): one task on the pool makes its pieces and queues them there, behind
        the previous step's (no wait for this thread between them). They are awaited, and
        the step closed, at the next finalize or the run's end (:meth:`_updated`; the
        schedule counts its held reads and intermediates until then)."""
        self.tracker.add(program.convert_bytes)
        started = _Updating(program, step, time.perf_counter())
        views = []
        for out_stream in program.outputs:
            row = []
            for (f,) in out_stream:  # (lowering: each output one whole fragment)
                view = self.sink.update_view(step.handles[f.target],
                                             program.destinations[f.target], f.view)
                if view is None:  # (a sink that keeps nothing: nothing to update)
                    return started
                row.append(view)
            views.append(tuple(row))
        streams = tuple(tuple(step.held.get((i, j)) for j in range(len(s)))
                        for i, s in enumerate(program.sources))
        (op,) = program.ops
        workers = max(1, self.schedule.threads)  # (all of it on the pool, see _pool)

        def queued() -> list[Future]:
            return [self.pool.submit(_no_grad, p) for p in op.update(tuple(views), streams, workers)]

        started.pieces = self.pool.submit(_no_grad, queued)
        return started

    def _updated(self) -> None:
        """The started in-place step's pieces awaited, its temporaries released, its
        destinations closed (nothing when none is running)."""
        started, self.updating = self.updating, None
        if started is None:
            return
        program, step = started.program, started.step
        try:
            for done in started.pieces.result() if started.pieces is not None else ():
                done.result()
        except Exception as e:
            keys = ", ".join(n.label for s in program.sources for n in s)
            raise ExecutionError(f"{program.ops[0]!r} failed updating {program.label} in "
                                 f"place (sources {keys}): {e}") from e
        finally:
            self.tracker.sub(program.convert_bytes + program.held_bytes)
            step.held.clear()
            self.convert_seconds += time.perf_counter() - started.start
        self._close(program, step)


def _merges(in_place: bool, ops: tuple[Any, ...]) -> bool:
    """Whether a step (``in_place``, its ``ops``) merges an adapter: its arithmetic runs on
    the pool's threads."""
    return in_place or any(op.merges_adapter for op in ops)


def _no_grad(fn: Callable[..., Any], *args: Any) -> Any:
    with torch.no_grad():  # (a pool thread: grad mode is per thread)
        return fn(*args)


def _run_ops(program: Step, step: _Step) -> Streams[torch.Tensor]:
    """Run the step's materialized op nodes, stage by stage, on the held reads."""
    streams = tuple(tuple(step.held[(i, j)] for j in range(len(s)))
                    for i, s in enumerate(program.sources))
    for k, op in enumerate(program.ops):
        try:
            streams = op.forward(streams)
        except Exception as e:
            keys = ", ".join(n.label for s in program.sources for n in s)
            raise ExecutionError(f"op #{k} {op!r} failed for {program.label} (sources "
                                 f"{keys}): {e}") from e
    return streams


@cache
def _strided_read() -> ModuleType:
    """``strided_read``, imported by the first strided read of a process (once)."""
    from weightplan.executor import strided_read

    return strided_read


def _read_task(run: _Execution, program: Step, step: _Step, task: ReadTask,
               piece: tuple[int, int]) -> None:
    if _read_straight(run, program, step, task, piece) or (
            task.layout.runs is not None  # a strided read (its module only then)
            and _strided_read().runs_straight(run, program, step, task)):
        return
    if task.dequantize is not None and task.dequantize.scheme is not None:
        from weightplan.executor.packed import packed_read

        packed_read(run, program, step, task)  # a packed format: its own windows
        return
    with _source(run, task, piece) as src:
        if task.dequantize is not None:  # (FP8: its kernel imported only for FP8 reads)
            from weightplan.executor.dequant import dequantize_read

            dequantize_read(run, program, step, task, src)
            return
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


def _read_straight(run: _Execution, program: Step, step: _Step, task: ReadTask,
                   piece: tuple[int, int]) -> bool:
    """A direct read into a file (a tensor streamed to the disk, a shard written straight)
    is copied file to file by the kernel (:meth:`Reader.copy_into`), warm or cold; one of a
    cold (or unleased) file goes from the file straight into the destination's bytes
    (:meth:`Reader.read_into`). False when neither can (a warm leased file into memory, an
    in-memory source, a sink without CPU bytes, two files the kernel can't copy between):
    the caller copies out of a window."""
    f, entry = task.fragment, task.entry
    if not task.direct or f is None or entry.file is None:
        return False
    handle = step.handles[f.target]
    in_memory = isinstance(handle, torch.Tensor)  # (else a file, or nothing kept)
    if in_memory and not run.reader.reads_straight(entry.file):
        return False  # (a warm file into memory: the common case, decided first)
    dest = program.destinations[f.target]
    offset = f.view.offset * dest.spec.dtype.itemsize + piece[0]
    region = None if in_memory else run.sink.file_region(handle, dest, offset)
    if region is not None:
        return run.reader.copy_into(entry.file, task.byte_range[0] + piece[0], piece[1],
                                    *region)  # (fd, offset, path)
    if not run.reader.reads_straight(entry.file):
        return False
    target = run.sink.byte_view(handle, dest, offset, piece[1])
    if target is None:
        return False
    run.reader.read_into(entry.file, task.byte_range[0] + piece[0], target)
    return True


class _source:
    """One piece of a read: its raw bytes when the read is direct, else the typed region
    (strided into a mapped file window, or a view of the in-memory tensor)."""

    def __init__(self, run: _Execution, task: ReadTask, piece: tuple[int, int]):
        self.run, self.task, self.piece = run, task, piece
        self._window: contextlib.AbstractContextManager[torch.Tensor] | None = None
        self.held = 0  # a strided read's buffer

    def __enter__(self) -> torch.Tensor:
        task, (start, length) = self.task, self.piece
        entry = task.entry
        if entry.file is None:
            assert self.run.checkpoint.tensors is not None  # entries without a file are in memory
            tensor = self.run.checkpoint.tensors[entry.key]
            if not task.direct:
                return tensor[_slices(task.region)]
            first = task.byte_range[0] + start
            return _flat_bytes(tensor)[first:first + length]
        if task.layout.runs is not None:  # a strided read: only its runs, into a buffer
            self.held = task.layout.runs.nbytes
            self.run.tracker.add(self.held)
            return _strided_read().runs_region(self.run.reader, task)
        self._window = self.run.reader.window(entry.file, task.byte_range[0] + start, length)
        self.run.tracker.add(length)
        raw = self._window.__enter__()
        if task.direct:
            return raw
        return torch.as_strided(raw.view(entry.spec.dtype), task.region.shape,
                                row_major_strides(entry.spec.shape), 0)

    def __exit__(self, *exc: Any) -> None:
        self.run.tracker.sub(self.held)
        if self._window is not None:
            self._window.__exit__(*exc)
            self.run.tracker.sub(self.piece[1])


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1) if tensor.dim() else tensor.detach().reshape(1)
    return flat.view(torch.uint8)


def _slices(region: Region) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(region.starts, region.stops, strict=True))


def _pool(schedule: Schedule, threads: int) -> Executor:
    """The reader threads; where a step merges an adapter (its pieces, or its ops, run on
    them too), threads each holding torch at one intra-op thread (:mod:`.intra_op`, only
    then)."""
    if not any(_merges(p.in_place, p.ops) for p in schedule.steps):
        return ThreadPoolExecutor(threads, thread_name_prefix="weightplan")
    from weightplan.executor.intra_op import single_threaded_pool

    return single_threaded_pool(threads)


def run_plan(schedule: Schedule, checkpoint: Checkpoint, sink: Sink, *, progress: bool | None,
             description: str = "loading") -> RunStats:
    """Execute ``schedule``'s steps from ``checkpoint`` into ``sink``; the sink commits only
    when every step succeeded."""
    meter, tracker = RssMeter(), Tracker()
    started = time.perf_counter()
    threads = schedule.threads
    pool: Executor = (_InlinePool() if not threads else _pool(schedule, threads))
    total = sum(p.read_bytes for p in schedule.steps)
    bar = LoadProgress(total, wants_progress(progress), description)
    try:
        with Reader(checkpoint) as reader, bar:
            run = _Execution(schedule, checkpoint, sink, reader, pool, tracker, bar)
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
