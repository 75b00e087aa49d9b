"""The execution schedule and its memory model.

Steps (one per loading conversion) run in checkpoint order, so reads sweep each file
front to back. The executor's policy is fixed here, as data: before *submitting* a step
(allocating its destinations and queueing its reads), the oldest pending steps are
*finalized* (their reads awaited, their materialized ops run) until the bytes of reads
in flight and of outputs staged for writing, plus the new step's, fit in
``window_bytes``. The resulting event list is what :mod:`weightplan.executor` walks,
so the estimate below describes what it will hold:

    planned(event) = resident (model tensors allocated so far)
                   + in flight (temporaries of pending reads, held op inputs)
                   + intermediate (tensors the finalized step's ops allocate)

An in-place step's update (a merged adapter's pieces) is only started at its finalize; it
finishes on the pool while the events after it run, and is awaited at the next finalize
(or the end): until then its held inputs, intermediates and staged outputs (a
disk-offloaded destination, written when the step closes) count at every event.
Without a pool (``threads=0``) a step's reads run within its submit: its windows count
there only. ``peak_bytes`` is the maximum over events.
"""

from __future__ import annotations

import bisect
import os
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import compress
from operator import add, attrgetter, itemgetter
from typing import overload

from weightplan.planner.tensors.schedule.machine import default_window_bytes
from weightplan.planner.tensors.lower.placement import Step


class EventKind(Enum):
    SUBMIT = "submit"
    FINALIZE = "finalize"


_SUBMIT, _FINALIZE = EventKind.SUBMIT, EventKind.FINALIZE


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


_KINDS = (_SUBMIT, _FINALIZE)  # an event's kind by its column value


class Events(Sequence[Event]):
    """The event list as columns: each event's step (a machine-integer array) and whether
    it finalizes (a byte); an :class:`Event` is made when one is asked for. A plan of 1M
    one-key steps has 2M events: as objects (and their step ints) ~140 B per step, as
    columns 18."""

    __slots__ = ("steps", "finalizes")

    def __init__(self, steps: array[int], finalizes: bytes | bytearray) -> None:
        self.steps, self.finalizes = steps, finalizes

    @classmethod
    def of(cls, events: Iterable[Event]) -> Events:
        """The columns of ``events`` (objects: a schedule made by hand)."""
        events = tuple(events)
        return cls(array("q", [e.step for e in events]),
                   bytes(e.kind is _FINALIZE for e in events))

    def __len__(self) -> int:
        return len(self.steps)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Event, ...]: ...

    def __getitem__(self, index: int | slice) -> Event | tuple[Event, ...]:
        if isinstance(index, slice):
            return tuple(map(Event, map(_KINDS.__getitem__, self.finalizes[index]),
                             self.steps[index]))
        return Event(_KINDS[self.finalizes[index]], self.steps[index])

    def __iter__(self) -> Iterator[Event]:
        return map(Event, map(_KINDS.__getitem__, self.finalizes), self.steps)

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same events (a tuple of them included)."""
        if isinstance(other, Events):
            return self.steps == other.steps and self.finalizes == other.finalizes
        return isinstance(other, (tuple, list)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Events({list(self)!r})"


class Timeline(Sequence[MemoryPoint]):
    """The planned bytes after each event, held as columns (three machine-integer arrays,
    the events and the steps they name): a :class:`MemoryPoint` is made when one is
    asked for. A plan of 1M one-key steps holds 2M points; as objects they would cost
    ~200 B per step, as columns 48."""

    __slots__ = ("_steps", "_events", "_resident", "_in_flight", "_intermediate")

    def __init__(self, steps: Sequence[Step], events: Events, resident: array[int],
                 in_flight: array[int], intermediate: array[int]) -> None:
        self._steps, self._events = steps, events
        self._resident, self._in_flight, self._intermediate = resident, in_flight, intermediate

    def __len__(self) -> int:
        return len(self._resident)

    @overload
    def __getitem__(self, index: int) -> MemoryPoint: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[MemoryPoint, ...]: ...

    def __getitem__(self, index: int | slice) -> MemoryPoint | tuple[MemoryPoint, ...]:
        if isinstance(index, slice):
            return tuple(map(self.__getitem__, range(len(self))[index]))
        event = self._events[index]  # (raises IndexError past the end: iteration stops)
        if index < 0:
            index += len(self)
        return MemoryPoint(event, self._steps[event.step].label, self._resident[index],
                           self._in_flight[index], self._intermediate[index])

    def totals(self) -> list[int]:
        """Each point's total, without making the points."""
        return list(map(add, map(add, self._resident, self._in_flight), self._intermediate))

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same points (a tuple of them included)."""
        return isinstance(other, (Timeline, tuple, list)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Timeline({list(self)!r})"

@dataclass(frozen=True)
class Schedule:
    """Ordered programs, the event list the executor obeys, and the memory timeline."""

    steps: tuple[Step, ...]
    events: Events
    timeline: Timeline
    window_bytes: int
    threads: int

    @property
    def peak(self) -> MemoryPoint | None:
        """The first point of the largest total (``None``: no event)."""
        totals = self.timeline.totals()
        return self.timeline[totals.index(max(totals))] if totals else None

    @property
    def peak_bytes(self) -> int:
        peak = self.peak
        return peak.total if peak else 0


def order_steps(programs: Iterable[Step], file_order: Sequence[str]) -> tuple[Step, ...]:
    """Checkpoint order: by file, then by the offset of the first byte read.

    Each step's key is taken as it comes (``programs`` may be the steps as they are
    made: their reads are still in the CPU cache then)."""
    rank: dict[str | None, int] = {f: i for i, f in enumerate(file_order)}

    def key(p: Step) -> tuple[int, int]:
        # the lowest rank of the files its reads are in (a read in memory, or in a file
        # not in the order: -1), then the smallest first byte of its reads in those
        reads = p.reads
        if len(reads) == 1:  # (a plain key's step)
            read = reads[0]
            return rank.get(read.entry.file, -1), read.entry.offset + read.layout.first
        if not reads:
            return -1, 0
        files = list(map(_FILE, reads))
        starts: Iterable[int] = map(add, map(_OFFSET, reads), map(_FIRST, reads))
        if files.count(files[0]) == len(files):  # (one file: most steps)
            return rank.get(files[0], -1), min(starts)
        ranks = {f: rank.get(f, -1) for f in set(files)}  # (a step's files are a few)
        lowest = min(ranks.values())
        return lowest, min(compress(starts, map(lowest.__eq__, map(ranks.__getitem__, files))))

    keyed = [(key(p), p) for p in programs]
    keyed.sort(key=_KEY)  # stable, as sorted(programs, key=key)
    return tuple(map(_STEP, keyed))


_KEY, _STEP = itemgetter(0), itemgetter(1)
_FILE, _OFFSET = attrgetter("entry.file"), attrgetter("entry.offset")
_FIRST = attrgetter("layout.first")


def effective_threads(threads: int) -> int:
    """Copies out of the page cache are CPU-bound: never more workers than CPUs."""
    return min(threads, os.cpu_count() or 1)


def make_schedule(steps: tuple[Step, ...], *, threads: int,
                  window_bytes: int | None = None) -> Schedule:
    sizes = _windowed(steps)
    # by default bounded (planner/tensors/machine.py), not grown to the largest group
    window = max(window_bytes, max(sizes, default=0)) if window_bytes is not None else \
        default_window_bytes()
    events = plan_events(sizes, window)
    workers = effective_threads(threads)
    return Schedule(steps, events, simulate(steps, events, workers), window, workers)


def plan_events(sizes: Sequence[int], window: int) -> Events:
    """Submit each step (``sizes``: what each holds in flight, :func:`_windowed`) in
    order; before it, finalize the oldest pending steps until the
    reads in flight and its own fit in ``window`` (as columns: :class:`Events`). A step's
    staged outputs (assembled in host memory until its finalize writes them: a file's
    dequantized tensor, one on its way to the disk) are in flight with its reads: without
    them a dequantizing convert or offload held every output before writing the first."""
    order, finalizes = array("q"), bytearray()
    pending: deque[int] = deque()
    in_flight = 0
    for s, size in enumerate(sizes):
        while pending and in_flight + size > window:
            done = pending.popleft()
            order.append(done)
            finalizes.append(1)
            in_flight -= sizes[done]
        order.append(s)
        finalizes.append(0)
        pending.append(s)
        in_flight += size
    order.extend(pending)
    finalizes += bytes([1]) * len(pending)
    return Events(order, finalizes)


def _windowed(steps: Sequence[Step]) -> list[int]:
    """What each pending step holds that the window bounds: its reads and staged outputs
    (C-level maps: a step each for 69k-tensor checkpoints)."""
    return list(map(add, map(_READ_BYTES, steps), map(_STAGED_BYTES, steps)))


_READ_BYTES, _STAGED_BYTES = attrgetter("read_bytes"), attrgetter("staged_bytes")


def simulate(steps: Sequence[Step], events: Events, threads: int) -> Timeline:
    """Planned memory after each event (see the module docstring).

    Kept incrementally (the pending steps' held op inputs and staged outputs as a sum,
    the windows they map as a :class:`SortedWindows`, of which the ``threads`` largest can
    be mapped at once), so a checkpoint of many small tensors, all pending at once, stays
    linear-ish. A pool of width 0 (``threads=0``: each read runs when it is queued) maps
    one window at a time, only the submitted step's, at its submit: a step's reads are
    done by the event after it, so its windows leave the pending ones there (its held
    inputs stay until its finalize, as with a pool). Counting them until the finalize
    planned 1.18x what a 3 MB int4 checkpoint held.
    """
    resident = held = updating = 0  # (updating: the last in-place step's, see below)
    residents, in_flights, intermediates = array("q"), array("q"), array("q")
    windows, readers = SortedWindows(), max(threads, 1)
    counts: list[Mapping[int, int]] = [_NO_WINDOWS] * len(steps)  # (a pending step's windows)
    for s, finalize in zip(events.steps, events.finalizes, strict=True):
        program = steps[s]
        if not finalize:
            resident += program.dest_bytes
            held += program.held_bytes + program.staged_bytes
            counts[s] = counted = program.window_counts()
            windows.add_counts(counted)
            in_flights.append(held + updating + windows.largest(readers))
            intermediates.append(0)
            if not threads:  # (no pool: its reads ran in the submit, their windows closed)
                windows.remove_counts(counted)
                counts[s] = _NO_WINDOWS
        else:
            in_flights.append(held + windows.largest(readers))
            held -= program.held_bytes + program.staged_bytes
            windows.remove_counts(counts[s])
            counts[s] = _NO_WINDOWS
            intermediates.append(program.convert_bytes + updating)
            # (its staged output too: a disk-offloaded destination is written at its close)
            updating = (program.convert_bytes + program.held_bytes + program.staged_bytes
                        if program.in_place else 0)
        residents.append(resident)
    return Timeline(steps, events, residents, in_flights, intermediates)


_NO_WINDOWS: Mapping[int, int] = {}


class SortedWindows:
    """A multiset of window sizes with the sum of the ``k`` largest: each size counted, the
    distinct sizes kept sorted. A header of 1M small tensors has ~175k steps pending at once
    in a 256 MiB window, of a few thousand sizes: adding and removing a step costs its
    sizes, not the pending windows (a sorted list of each window moved them all: 20k keys
    6.7 µs a key, 100k keys 13.7)."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._distinct: list[int] = []  # the sizes counted, ascending

    def add_counts(self, counts: Mapping[int, int]) -> None:
        count = self._count
        for size, n in counts.items():
            had = count.get(size, 0)
            if not had:
                bisect.insort(self._distinct, size)
            count[size] = had + n

    def remove_counts(self, counts: Mapping[int, int]) -> None:
        count = self._count
        for size, n in counts.items():
            left = count[size] - n
            if left > 0:
                count[size] = left
            else:
                del count[size]
                del self._distinct[bisect.bisect_left(self._distinct, size)]

    def largest(self, k: int) -> int:
        total = 0
        for size in reversed(self._distinct):
            if k <= 0:
                break
            n = min(k, self._count[size])
            total += n * size
            k -= n
        return total

    def sizes(self) -> list[int]:
        """Every size held, ascending."""
        return [size for size in self._distinct for _ in range(self._count[size])]
