"""The execution schedule and its memory model.

Steps (one per loading conversion) run in checkpoint order, so reads sweep each file
front to back. The executor's policy is fixed here, as data: before *submitting* a step
(allocating its destinations and queueing its reads), the oldest pending steps are
*finalized* (their reads awaited, their materialized ops run) until the bytes of reads
in flight plus the new step's fit in ``window_bytes``. The resulting event list is what
:mod:`weightplan.executor` walks, so the estimate below describes what it will hold:

    planned(event) = resident (model tensors allocated so far)
                   + in flight (temporaries of pending reads, held op inputs)
                   + intermediate (tensors the finalized step's ops allocate)

``peak_bytes`` is the maximum over events.
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from weightplan.planner.tensors.placement import Step

DEFAULT_WINDOW_BYTES = 256 * 1024 * 1024


class EventKind(Enum):
    SUBMIT = "submit"
    FINALIZE = "finalize"


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    step: int


@dataclass(frozen=True, slots=True)
class MemoryPoint:
    """Planned bytes right after one event."""

    event: Event
    label: str
    resident: int
    in_flight: int
    intermediate: int

    @property
    def total(self) -> int:
        return self.resident + self.in_flight + self.intermediate


@dataclass(frozen=True)
class Schedule:
    """Ordered programs, the event list the executor obeys, and the memory timeline."""

    steps: tuple[Step, ...]
    events: tuple[Event, ...]
    timeline: tuple[MemoryPoint, ...]
    window_bytes: int
    threads: int

    @property
    def peak(self) -> MemoryPoint | None:
        return max(self.timeline, key=lambda p: p.total, default=None)

    @property
    def peak_bytes(self) -> int:
        peak = self.peak
        return peak.total if peak else 0


def order_steps(programs: Sequence[Step], file_order: Sequence[str]) -> tuple[Step, ...]:
    """Checkpoint order: by file, then by the offset of the first byte read."""
    rank = {f: i for i, f in enumerate(file_order)}

    def key(p: Step) -> tuple:
        firsts = [(rank.get(r.entry.file or "", -1), r.byte_range[0]) for r in p.reads]
        return min(firsts, default=(-1, 0))

    return tuple(sorted(programs, key=key))


def effective_threads(threads: int) -> int:
    """Copies out of the page cache are CPU-bound: never more workers than CPUs."""
    return min(threads, os.cpu_count() or 1)


def make_schedule(steps: tuple[Step, ...], *, threads: int,
                  window_bytes: int | None = None) -> Schedule:
    largest = max((p.read_bytes for p in steps), default=0)
    window = max(window_bytes if window_bytes is not None else DEFAULT_WINDOW_BYTES, largest)
    events = plan_events(steps, window)
    workers = effective_threads(threads)
    return Schedule(steps, events, simulate(steps, events, workers), window, workers)


def plan_events(steps: Sequence[Step], window: int) -> tuple[Event, ...]:
    events: list[Event] = []
    pending: deque[int] = deque()
    in_flight = 0
    for s, program in enumerate(steps):
        while pending and in_flight + program.read_bytes > window:
            done = pending.popleft()
            events.append(Event(EventKind.FINALIZE, done))
            in_flight -= steps[done].read_bytes
        events.append(Event(EventKind.SUBMIT, s))
        pending.append(s)
        in_flight += program.read_bytes
    events.extend(Event(EventKind.FINALIZE, s) for s in pending)
    return tuple(events)


def simulate(steps: Sequence[Step], events: Sequence[Event], threads: int
             ) -> tuple[MemoryPoint, ...]:
    """Planned memory after each event (see the module docstring)."""
    resident, pending, points = 0, [], []
    for event in events:
        program = steps[event.step]
        intermediate = 0
        if event.kind is EventKind.SUBMIT:
            resident += program.dest_bytes
            pending.append(event.step)
        else:
            intermediate = program.convert_bytes
        in_flight = _in_flight([steps[s] for s in pending], threads)
        if event.kind is EventKind.FINALIZE:
            pending.remove(event.step)
        label = program.label
        points.append(MemoryPoint(event, label, resident, in_flight, intermediate))
    return tuple(points)


def _in_flight(pending: Sequence[Step], threads: int) -> int:
    """Held op inputs and staged outputs, plus the largest windows that ``threads``
    readers can map at once."""
    held = sum(p.held_bytes + p.staged_bytes for p in pending)
    windows = [w for p in pending for w in p.window_sizes]
    return held + sum(heapq.nlargest(max(threads, 1), windows))
