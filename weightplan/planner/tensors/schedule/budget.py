"""Fitting a schedule under a memory budget, or saying why it can't fit.

Levers, cheapest first: the default order with the largest read-ahead window that fits;
then an order that runs the steps with large temporaries (held op inputs, staged outputs,
op intermediates) first, while little of the model is resident yet. Placement already
prefers in-place assembly, which is what makes most loads fit in the model's own size
plus a few read windows. When nothing fits, :class:`BudgetError` gives the smallest
budget that works and what it is made of.
"""

from __future__ import annotations

from weightplan.errors import BudgetError
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.schedule.machine import Fit, MachineMemory, machine_memory
from weightplan.planner.tensors.schedule.schedule import Schedule, make_schedule
from weightplan.units import format_bytes

MIN_STEP = 1 << 20  # window search resolution


def schedule_within(programs: tuple[Step, ...], *, threads: int, budget: int | None
                    ) -> Schedule:
    """The default schedule, or under ``budget`` the best one that fits."""
    schedule = make_schedule(programs, threads=threads)
    if budget is None or schedule.peak_bytes <= budget:
        return schedule
    orders = [programs, transient_first(programs)]
    tightest = [make_schedule(order, threads=threads, window_bytes=0) for order in orders]
    fitting = [(o, t) for o, t in zip(orders, tightest, strict=True) if t.peak_bytes <= budget]
    if not fitting:
        raise budget_error(budget, min(tightest, key=lambda t: t.peak_bytes))
    order, lower = fitting[0]
    return widest_window(order, lower, schedule.window_bytes, budget, threads)


def transient_first(programs: tuple[Step, ...]) -> tuple[Step, ...]:
    """Steps with the largest temporaries first (stable: checkpoint order otherwise)."""
    return tuple(sorted(programs, key=lambda p: -transient_bytes(p)))


def transient_bytes(program: Step) -> int:
    return program.held_bytes + program.staged_bytes + program.convert_bytes


def widest_window(order: tuple[Step, ...], fits: Schedule, upper: int, budget: int,
                  threads: int) -> Schedule:
    """Binary search of the read-ahead window: more read-ahead, more overlap."""
    lo, hi, best = fits.window_bytes, upper, fits
    while hi - lo > MIN_STEP:
        mid = (lo + hi) // 2
        candidate = make_schedule(order, threads=threads, window_bytes=mid)
        if candidate.peak_bytes <= budget:
            best, lo = candidate, mid
        else:
            hi = mid
    return best


def budget_error(budget: int, best: Schedule) -> BudgetError:
    peak = best.peak
    assert peak is not None  # a budget is only exceeded by a schedule with events
    step = best.steps[peak.event.step]
    biggest = max(best.steps, key=lambda p: p.dest_bytes + transient_bytes(p))
    return BudgetError(
        f"no schedule fits a budget of {format_bytes(budget)} ({budget} bytes): the smallest "
        f"possible peak is {format_bytes(best.peak_bytes)} ({best.peak_bytes} bytes) at step "
        f"{peak.event.step + 1}/{len(best.steps)} ({step.label}): model tensors "
        f"{format_bytes(peak.resident)} + reads in flight {format_bytes(peak.in_flight)} + "
        f"op intermediates {format_bytes(peak.intermediate)}. The largest group is "
        f"{biggest.label}: {format_bytes(biggest.dest_bytes + transient_bytes(biggest))}",
        minimum_bytes=best.peak_bytes)


def machine_fit(schedule: Schedule, model_bytes: int, memory: MachineMemory | None = None
                ) -> Fit:
    """Compare ``schedule``'s peak with this machine's memory (or ``memory``); when it
    doesn't fit but the model would, find the smallest peak any schedule has."""
    memory = memory if memory is not None else machine_memory()
    fit = Fit(schedule.peak_bytes, model_bytes, memory)
    if fit.fits is False and memory is not None and model_bytes <= memory.available:
        fit = Fit(fit.peak, model_bytes, memory, smallest_peak(schedule))
    return fit


def smallest_peak(schedule: Schedule) -> int:
    """The tightest schedule's peak: no read-ahead, checkpoint or temporaries-first order
    (what :func:`~weightplan.planner.tensors.schedule.budget.schedule_within` tries)."""
    steps = tuple(schedule.steps)
    return min(make_schedule(order, threads=schedule.threads, window_bytes=0).peak_bytes
               for order in (steps, transient_first(steps)))
