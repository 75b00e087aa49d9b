"""The automatic device map: fill devices in order with whole modules, splitting only what
may be split, so that each device's planned peak stays within its budget.

The fill walks the module tree top down, in the model's module order, over one queue of
*units* (modules, or tensors held directly by a split module). A unit goes to the current
device when the device's planned peak with it still fits: its weights so far, the unit's
new bytes (tensors already placed count once: ties), the device's temporaries while
loading (the ``concurrent`` largest staging copies among the tensors placed there) and a
fixed part (host staging on the CPU, room kept for an offloaded block). Otherwise a unit
that may be split is replaced by its parts (direct tensors first, then children); a whole
one moves the fill to the next device. Tied tensors stay on one device: a unit takes the
pending units sharing its tensors along with it. Parts that all landed on one device are
folded back into their module, so the map names as few modules as it can.

Everything here is arithmetic on names and byte counts, deterministic for equal inputs.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from weightplan.errors import BudgetError
from weightplan.planner.inputs.module_tree import ModuleTree
from weightplan.units import format_bytes


@dataclass(frozen=True)
class FillInput:
    """What the fill needs: the tree, and per canonical tensor its bytes and the device
    staging bytes its load copies through when it lands on an accelerator."""

    tree: ModuleTree
    canon: Mapping[str, str]  # tensor name (alias) → canonical name (ties share one)
    size: Mapping[str, int]  # canonical name → bytes on its device
    temp: Mapping[str, int]  # canonical name → staging bytes on an accelerator
    concurrent: int = 1  # staging copies in flight at once (the reader threads)
    host_offloaded: Mapping[str, int] = field(default_factory=dict)  # canonical name → host
    # bytes it holds on its way to the disk, were it offloaded (absent: all of its bytes)
    _sets: dict[str, frozenset[str]] = field(default_factory=dict, compare=False, repr=False)

    def tensors(self, unit: str) -> frozenset[str]:
        """Canonical tensors under ``unit`` (a module or a tensor name)."""
        found = self._sets.get(unit)
        if found is not None:
            return found
        node = self.tree.modules.get(unit)
        if node is None:
            found = frozenset((self.canon.get(unit, unit),))
        else:
            found = frozenset(self.canon.get(t, t) for t in node.tensors).union(
                *map(self.tensors, node.children))
        self._sets[unit] = found
        return found

    def parts(self, unit: str) -> tuple[str, ...]:
        """What ``unit`` splits into (empty: it is whole)."""
        node = self.tree.modules.get(unit)
        if node is None or node.whole:
            return ()
        return node.tensors + node.children

    def bytes_of(self, tensors: frozenset[str]) -> int:
        return sum(self.size.get(t, 0) for t in tensors)

    def host_bytes_offloaded(self, tensors: frozenset[str]) -> int:
        """Host bytes ``tensors`` hold on their way to the disk (see ``host_offloaded``)."""
        return sum(self.host_offloaded.get(t, self.size.get(t, 0)) for t in tensors)

    def resident(self, tensors: frozenset[str]) -> int:
        """Bytes of the non-persistent buffers among ``tensors`` (rotary ``inv_freq``):
        placed on the disk, they stay in memory where their modules run."""
        return sum(self.size.get(t, 0) for t in tensors if t in self.tree.extra_bytes)

    def staging_of(self, tensors: Iterable[str]) -> int:
        """An accelerator's staging for ``tensors``: the ``concurrent`` largest copies."""
        return sum(sorted(self.temp.get(t, 0) for t in tensors)[-self.concurrent:])


@dataclass(frozen=True, slots=True)
class Slot:
    """A device the fill may use: its capacity (None: unbounded) and fixed bytes."""

    device: str
    capacity: int | None
    fixed: int = 0  # bytes the device holds whatever goes there (room kept included)
    accelerator: bool = False
    kept: int = 0  # of ``fixed``: room kept for an offloaded block


class _Device:
    """A device's running totals during the fill."""

    def __init__(self, slot: Slot, keep: int):
        self.slot, self.keep = slot, keep
        self.weights = 0
        self.temps: list[int] = []  # the ``keep`` largest staging copies, ascending

    def reserve(self, temps: Sequence[int] = ()) -> int:
        if not self.slot.accelerator:
            return 0
        merged = sorted(self.temps + list(temps))[-self.keep:]
        return sum(merged)

    def need(self, new_bytes: int, temps: Sequence[int]) -> int:
        """The device's bytes with ``new_bytes`` (and their staging ``temps``) taken."""
        return self.weights + new_bytes + self.reserve(temps) + self.slot.fixed

    def fits(self, new_bytes: int, temps: Sequence[int]) -> bool:
        cap = self.slot.capacity
        return cap is None or self.need(new_bytes, temps) <= cap

    def take(self, new_bytes: int, temps: Sequence[int]) -> None:
        self.weights += new_bytes
        for t in temps:
            if t:
                bisect.insort(self.temps, t)
        del self.temps[:-self.keep]


def roots(inp: FillInput) -> tuple[str, ...]:
    """The units the fill starts from: the root module whole."""
    return ("",)


def largest_whole(inp: FillInput) -> int:
    """Bytes of the largest unit that can't be split (a layer offloaded to the CPU or the
    disk runs on the main device: room for it is kept there, as accelerate keeps)."""
    best, stack = 0, list(roots(inp))
    while stack:
        unit = stack.pop()
        parts = inp.parts(unit)
        if parts:
            stack += parts
        else:
            best = max(best, inp.bytes_of(inp.tensors(unit)))
    return best


def fill(inp: FillInput, slots: Sequence[Slot]) -> dict[str, str]:
    """``{unit: device}`` (see the module docstring).

    Raises:
        BudgetError: the last device is full too (a bounded ``"disk"``).
    """
    devices = [_Device(s, max(1, inp.concurrent)) for s in slots]
    tied = _tied(inp)
    queue: deque[str] = deque(roots(inp))
    placed: dict[str, str] = {}  # canonical tensor → device
    result: dict[str, str] = {}
    splits: list[tuple[str, tuple[str, ...]]] = []
    at = 0
    while queue:
        unit = queue.popleft()
        group = [unit] + (_companions(inp, unit, queue) if inp.tensors(unit) & tied else [])
        tensors = frozenset().union(*map(inp.tensors, group))
        new = tensors.difference(placed)
        temps = [inp.temp.get(t, 0) for t in new]
        device = devices[at]
        if device.fits(inp.bytes_of(new), temps):
            device.take(inp.bytes_of(new), temps)
            for u in group:
                result[u] = device.slot.device
                if u is not unit:
                    queue.remove(u)
            placed.update(dict.fromkeys(new, device.slot.device))
            continue
        parts = inp.parts(unit)
        if parts:
            splits.append((unit, parts))
            queue.extendleft(reversed(parts))
            continue
        at += 1
        if at == len(devices):
            raise _full(inp, unit, tensors, slots)
        queue.appendleft(unit)
    return _folded(result, splits)


def _tied(inp: FillInput) -> frozenset[str]:
    """Canonical tensors held under more than one name (ties)."""
    seen: dict[str, int] = {}
    for canonical in inp.canon.values():
        seen[canonical] = seen.get(canonical, 0) + 1
    return frozenset(c for c, n in seen.items() if n > 1)


def _companions(inp: FillInput, unit: str, queue: deque[str]) -> list[str]:
    """The pending units sharing a tensor with ``unit`` (they go where it goes)."""
    mine = inp.tensors(unit)
    return [u for u in queue if u != unit and not inp.tensors(u).isdisjoint(mine)]


def _folded(result: dict[str, str], splits: list[tuple[str, tuple[str, ...]]]
            ) -> dict[str, str]:
    """Split modules whose parts all landed on one device, named as the module again (in
    the place of its first part)."""
    for unit, parts in reversed(splits):
        devices = {result.get(p) for p in parts}
        if len(devices) != 1 or None in devices:
            continue
        device, members = result[parts[0]], set(parts)
        items = list(result.items())
        first = next(i for i, (u, _) in enumerate(items) if u in members)
        items = [kv for kv in items[:first] if kv[0] not in members] + [(unit, device)] + \
            [kv for kv in items[first:] if kv[0] not in members]
        result = dict(items)
    return result


def _full(inp: FillInput, unit: str, tensors: frozenset[str], slots: Sequence[Slot]
          ) -> BudgetError:
    last = slots[-1]
    need = inp.bytes_of(tensors)
    return BudgetError(f"automatic placement: {unit or 'the model'} ({format_bytes(need)}) "
                       f"fits on no device: {last.device} is full too "
                       f"({format_bytes(last.capacity or 0)}); raise max_memory",
                       minimum_bytes=need)


def first_need(inp: FillInput, slot: Slot) -> tuple[str, int] | None:
    """The first unit with bytes the fill tries on ``slot`` (the first whole one in module
    order, with the units sharing its tensors) and the capacity ``slot`` needs to take it:
    below it, the fill keeps nothing there. ``None``: the model has no bytes."""
    tied, queue = _tied(inp), deque(roots(inp))
    while queue:
        unit = queue.popleft()
        parts = inp.parts(unit)
        if parts:
            queue.extendleft(reversed(parts))
            continue
        group = [unit] + (_companions(inp, unit, queue) if inp.tensors(unit) & tied else [])
        tensors = frozenset().union(*map(inp.tensors, group))
        size = inp.bytes_of(tensors)
        if not size:
            continue  # (placed wherever the fill is: it changes nothing)
        device = _Device(slot, max(1, inp.concurrent))
        return unit, device.need(size, [inp.temp.get(t, 0) for t in tensors])
    return None
