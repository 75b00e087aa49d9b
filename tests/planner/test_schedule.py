"""The schedule by hand: exact events and memory timeline (no explain())."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from weightplan.planner.tensors.lower.placement import plan_step
from weightplan.planner.tensors.schedule.schedule import (
    Event, EventKind, MemoryPoint, make_schedule,
)

from tests.conftest import Doubler
from tests.planner.core import conversion, entry

S, F = EventKind.SUBMIT, EventKind.FINALIZE


def three_steps():
    return tuple(plan_step(conversion([[entry(f"w{i}", (6,), 24 * i)]], [f"w{i}"]))
                 for i in range(3))


def test_a_window_of_two_reads_finalizes_the_oldest_before_the_third():
    schedule = make_schedule(three_steps(), threads=1, window_bytes=48)
    assert schedule.events == (Event(S, 0), Event(S, 1), Event(F, 0), Event(S, 2),
                               Event(F, 1), Event(F, 2))
    # resident: 24 B per submitted step; in flight: one mapped 24 B window (one thread)
    assert [(p.resident, p.in_flight, p.intermediate) for p in schedule.timeline] == [
        (24, 24, 0), (48, 24, 0), (48, 24, 0), (72, 24, 0), (72, 24, 0), (72, 24, 0)]
    assert schedule.peak_bytes == 96 and schedule.peak.event == Event(S, 2)


def test_the_timeline_held_as_columns_is_the_sequence_of_its_points():
    steps = three_steps()
    timeline = make_schedule(steps, threads=1, window_bytes=48).timeline
    points = list(timeline)
    assert len(points) == len(timeline) == 6 and all(isinstance(p, MemoryPoint) for p in points)
    assert points[3] == MemoryPoint(Event(S, 2), steps[2].label, 72, 24, 0)
    assert timeline[-1] == points[-1] and timeline[1:3] == tuple(points[1:3])
    assert timeline == tuple(points) and timeline != tuple(points[:-1])
    assert timeline.totals() == [p.total for p in points]
    assert timeline.index(points[3]) == 3
    # the peak is the first point of the largest total (as max() over the points gives)
    same = make_schedule(steps, threads=1, window_bytes=48)
    assert same.peak == max(points, key=lambda p: p.total) and same.timeline == timeline


def test_no_window_runs_each_step_alone():
    schedule = make_schedule(three_steps(), threads=1, window_bytes=0)
    assert schedule.events == (Event(S, 0), Event(F, 0), Event(S, 1), Event(F, 1),
                               Event(S, 2), Event(F, 2))
    assert schedule.window_bytes == 24  # never below the largest step


def test_without_a_pool_a_steps_window_is_mapped_only_in_its_submit():
    # threads=0: the reads run as they are queued, one at a time, and are done when the
    # submit returns: a pending step maps nothing at the next events
    schedule = make_schedule(three_steps(), threads=0, window_bytes=48)
    assert schedule.events == make_schedule(three_steps(), threads=1, window_bytes=48).events
    assert [(p.resident, p.in_flight, p.intermediate) for p in schedule.timeline] == [
        (24, 24, 0), (48, 24, 0), (48, 0, 0), (72, 24, 0), (72, 0, 0), (72, 0, 0)]
    assert schedule.peak_bytes == 96 and schedule.threads == 0


def test_without_a_pool_held_op_inputs_stay_until_the_finalize():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(2)]
    step = plan_step(conversion([experts], ["d.*.w"], [Doubler()]))
    submit, finalize = make_schedule((step,), threads=0).timeline
    # the two 24 B reads kept as op inputs; the window only while they ran (the submit)
    assert (submit.resident, submit.in_flight, submit.intermediate) == (48, 72, 0)
    assert (finalize.resident, finalize.in_flight, finalize.intermediate) == (48, 48, 48)


def test_materialized_ops_hold_their_inputs_and_outputs():
    experts = [entry(f"e.{i}.w", (2, 3), 24 * i) for i in range(2)]
    step = plan_step(conversion([experts], ["d.*.w"], [Doubler()]))
    schedule = make_schedule((step,), threads=1)
    submit, finalize = schedule.timeline
    # two 24 B reads kept as op inputs + one mapped window; the op allocates 48 B
    assert (submit.resident, submit.in_flight, submit.intermediate) == (48, 72, 0)
    assert (finalize.resident, finalize.in_flight, finalize.intermediate) == (48, 72, 48)
    assert schedule.peak_bytes == 168


def test_sorted_windows_add_and_remove_a_steps_windows_at_once():
    from weightplan.planner.tensors.schedule.schedule import SortedWindows

    one_by_one, at_once = SortedWindows(), SortedWindows()
    for size in (5, 1, 5, 3):
        one_by_one.add_counts({size: 1})
    at_once.add_counts(Counter((5, 1, 5, 3)))
    assert at_once.sizes() == one_by_one.sizes() == [1, 3, 5, 5]
    at_once.add_counts(Counter((4, 5)))
    assert at_once.largest(3) == 15
    at_once.remove_counts(Counter((5, 5, 1)))
    assert at_once.sizes() == [3, 4, 5] and at_once.largest(2) == 9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(1, 9), min_size=1, max_size=6)),
                max_size=40),
       st.integers(1, 6))
def test_sorted_windows_hold_what_a_sorted_list_would(moves, k):
    """Steps' windows added and removed in any order (a pending step leaves once): the
    sizes held and the sum of the ``k`` largest, as a plain sorted list says."""
    from weightplan.planner.tensors.schedule.schedule import SortedWindows

    windows, plain, pending = SortedWindows(), [], []
    for add, sizes in moves:
        if add or not pending:
            windows.add_counts(Counter(sizes))
            plain += sizes
            pending.append(sizes)
        else:
            gone = pending.pop(len(pending) // 2)
            windows.remove_counts(Counter(gone))
            for size in gone:
                plain.remove(size)
        plain.sort()
        assert windows.sizes() == plain
        assert windows.largest(k) == sum(plain[-k:])
