"""``device_map="auto" | "balanced" | "balanced_low_0" | "sequential"``: the placement, and
what each device holds at its peak, from the plan's own sizes.

Per device, the planned peak is

- on an accelerator: the weights placed there + its staging copies (a tensor whose bytes
  are not copied straight into place lands in a temporary on the device first: a cast or
  a strided write; an FP8 weight dequantized there, its FP8 bytes, scale tiles and fp32
  workspace; ``concurrent`` of them at once, the largest counted);
- on the CPU: the weights placed there + the load's host side: the schedule's temporaries
  (reads in flight, op intermediates), the pinned staging buffers CUDA copies go through
  (sized by what goes there: :func:`staging_of`), and the tensors on their way to the disk
  that are assembled in host memory (a window of them; the ones referenced in place or
  streamed take none); the disk's modules' non-persistent buffers (rotary ``inv_freq``),
  which stay in memory, apart (``resident``: held, not counted against ``max_memory``);
- on the disk: the bytes written to ``offload_folder``.

When anything is offloaded, room for the largest whole block is also kept on the main
device (and on the CPU when the disk is used): an offloaded block runs there. ``"auto"``
and ``"balanced"`` first cap each accelerator but the last at an even share of the model
(plus a block), as transformers does; ``"balanced_low_0"`` keeps the first one as empty as
the others allow; ``"sequential"`` fills each to its budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from weightplan.errors import BudgetError, PlanError
from weightplan.planner.inputs.device import (
    STAGING_BUFFERS, STAGING_CHUNK, DeviceMap, StagingPool, staging_pool,
)
from weightplan.planner.inputs.module_tree import ModuleTree, subtree_tensors
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.core.geometry import Fragment
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.lower.read_tasks import ReadTask
from weightplan.planner.tensors.schedule.auto_map import (
    FillInput, Slot, fill, first_need, largest_whole,
)
from weightplan.planner.tensors.schedule.dequant_side import device_staging
from weightplan.planner.tensors.schedule.device_budgets import CPU, DISK, DeviceBudget
from weightplan.planner.tensors.schedule.offload_plan import OffloadPlan, host_bytes_offloaded
from weightplan.planner.tensors.schedule.schedule import Schedule
from weightplan.units import format_bytes

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
PASSES = 4  # fills before the room kept for offloading is taken at its bound
POOL_BOUND = STAGING_CHUNK * STAGING_BUFFERS  # the pinned pool, at most


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One device of an automatic placement: bytes, peak, budget."""

    device: str
    budget: int | None
    weights: int  # bytes of the tensors placed there
    staging: int  # accelerator: staging copies; CPU: the load's host temporaries
    kept: int  # room kept for an offloaded block
    modules: int  # entries of the device map on it
    present: bool  # this machine has it
    resident: int = 0  # CPU: the disk's modules' non-persistent buffers (not in max_memory)

    @property
    def peak(self) -> int:
        """Planned bytes at the load's peak (weights + staging + resident buffers)."""
        return self.weights + self.staging + self.resident


@dataclass(frozen=True)
class DevicePlacement:
    """An automatic placement: the map, and what each device holds."""

    strategy: str
    device_map: tuple[tuple[str, str], ...]  # (module or tensor, device), in module order
    uses: tuple[DeviceUse, ...]
    offload_folder: str | None = None
    pinned_bytes: int = 0  # host staging for CUDA copies (pinned buffers), in the CPU's
    offload: OffloadPlan | None = None  # the disk's tensors: referenced in place or written
    # nothing off the disk: (the first device, its first unit, the budget that keeps it)
    resident_need: tuple[str, str, int] | None = None

    def device_of(self, name: str) -> str:
        """The device of a tensor or module ``name`` (its longest mapped prefix)."""
        best, device = -1, CPU
        for prefix, d in self.device_map:
            if (not prefix or name == prefix or name.startswith(prefix + ".")) \
                    and len(prefix) > best:
                best, device = len(prefix), d
        return device

    @property
    def absent(self) -> tuple[str, ...]:
        """Devices the map uses that this machine doesn't have (a dry run)."""
        used = {d for _, d in self.device_map}
        return tuple(u.device for u in self.uses if not u.present and u.device in used)

    @property
    def main_device(self) -> str:
        """Where offloaded modules run: the first accelerator holding weights, else the CPU."""
        return next((u.device for u in self.uses if u.weights and u.device not in (CPU, DISK)),
                    CPU)

    @property
    def peaks(self) -> dict[str, int]:
        return {u.device: u.peak for u in self.uses if u.weights or u.staging}


@dataclass(frozen=True, slots=True)
class HostCosts:
    """The load's host side, known from the schedule before placement."""

    temporaries: int  # the schedule's largest reads-in-flight + intermediates
    window: int  # bytes of reads in flight at most


def place_devices(strategy: str, budgets: Sequence[DeviceBudget], tree: ModuleTree,
                  info: ModelInfo, schedule: Schedule, dtype: torch.dtype | None,
                  host: HostCosts, offload_folder: str | None = None) -> DevicePlacement:
    """The placement for ``strategy`` (see the module docstring).

    Raises:
        PlanError: an unknown strategy.
        BudgetError: the devices together can't hold the model (the budgets of the
            placement are checked once the disk's tensors are planned: :func:`check_budgets`).
    """
    if strategy not in STRATEGIES:
        raise PlanError(f"device_map={strategy!r}: automatic strategies are "
                        f"{', '.join(map(repr, STRATEGIES))}")
    inp = fill_input(tree, info, schedule.steps, dtype, schedule.threads)
    block, window = largest_whole(inp), host.window + _largest_step(schedule.steps)
    copies = _copies(schedule.steps, inp.canon)

    def pinned_of(result: Mapping[str, str]) -> int:  # the pool for what lands on CUDA
        on = frozenset().union(*(inp.tensors(u) for u, d in result.items() if _cuda(d)))
        return staging_pool(copies[t] for t in on if t in copies).nbytes

    result, slots, pinned = _converged(strategy, budgets, inp, host, block, window, pinned_of)
    uses = _uses(inp, result, slots, budgets)
    first = None if slots[0].device == DISK or any(u.weights for u in uses
                                                   if u.device != DISK) else \
        first_need(inp, slots[0])
    return DevicePlacement(strategy, tuple(result.items()), uses, offload_folder, pinned,
                           resident_need=None if first is None else (slots[0].device, *first))


def given_placement(pairs: Sequence[tuple[str, str]], tree: ModuleTree, info: ModelInfo,
                    schedule: Schedule, dtype: torch.dtype | None, host: HostCosts,
                    offload_folder: str | None,
                    budgets: Sequence[DeviceBudget] = ()) -> DevicePlacement:
    """A dict ``device_map`` that puts modules on ``"disk"`` (transformers' explicit offload):
    the map as given (``pairs``: prefix, device name), each device's use read off the
    plan's sizes as for an automatic one; ``budgets`` (``max_memory``) only bound the
    devices (:func:`check_budgets`): nothing is filled.

    Raises:
        PlanError: a tensor of the model's state no prefix covers
            (accelerate's ``dispatch_model`` runs only a complete map, as transformers says);
            an entry inside another, one of them on the disk (accelerate fails it).
    """
    _check_given(pairs)
    inp = fill_input(tree, info, schedule.steps, dtype, schedule.threads)
    per = _given_tensors(pairs, tree, inp.canon)
    copies = _copies(schedule.steps, inp.canon)
    pinned = staging_pool(copies[t] for d, ts in per.items() if _cuda(d) for t in ts
                          if t in copies).nbytes
    window = host.window + _largest_step(schedule.steps)
    disk = frozenset(per.get(DISK, ()))  # (its buffers stay in memory: the CPU's, apart)
    on_disk, resident = min(window, inp.host_bytes_offloaded(disk) - inp.resident(disk)), inp.resident(disk)
    bounds = {b.device: b.budget for b in budgets}
    uses = []
    for device in sorted({d for _, d in pairs} | {CPU}, key=lambda d: (d == DISK, d == CPU, d)):
        tensors = frozenset(per.get(device, ()))
        if device in (CPU, DISK):
            staging = host.temporaries + pinned + on_disk if device == CPU else 0
        else:
            staging = inp.staging_of(tensors)
        uses.append(DeviceUse(device, bounds.get(device), inp.bytes_of(tensors) - (resident if device == DISK else 0),
                              staging, 0, sum(d == device for _, d in pairs), True, resident if device == CPU else 0))
    return DevicePlacement("dict", tuple(pairs), tuple(uses), offload_folder, pinned)


def _check_given(pairs: Sequence[tuple[str, str]]) -> None:
    nested = [(p, q) for p, d in pairs for q, e in pairs if p != q and DISK in (d, e)
              and (not q or p.startswith(q + "."))]
    if nested:
        inner, outer = nested[0]
        raise PlanError(f"device_map: {inner!r} lies inside "
                        f"{repr(outer) if outer else 'the whole model'}, and "
                        "one of them is on 'disk': accelerate's hooks can't run a module "
                        "offloaded inside another entry (transformers' load fails the same way "
                        "at dispatch); map sibling modules instead")


def _given_tensors(pairs: Sequence[tuple[str, str]], tree: ModuleTree,
                   canon: Mapping[str, str]) -> dict[str, set[str]]:
    """Device → the canonical tensors its entries cover (the longest prefix decides)."""
    by_length = sorted(pairs, key=lambda p: -len(p[0]))
    per: dict[str, set[str]] = {}
    uncovered = []
    for name in subtree_tensors(tree, ""):
        device = next((d for p, d in by_length
                       if not p or name == p or name.startswith(p + ".")), None)
        if device is None:
            uncovered += [] if name in tree.extra_bytes else [name]
            device = CPU  # (a non-persistent buffer: where the load keeps it)
        per.setdefault(device, set()).add(canon.get(name, name))
    if uncovered:
        raise PlanError("device_map gives no device for "
                        f"{', '.join(uncovered[:4])}{' ...' if len(uncovered) > 4 else ''} "
                        f"({len(uncovered)} tensors): name their modules (as transformers, every "
                        "tensor of the state needs a device)")
    return per


def _converged(strategy: str, budgets: Sequence[DeviceBudget], inp: FillInput,
               host: HostCosts, block: int, window: int,
               pinned_of: Callable[[Mapping[str, str]], int]
               ) -> tuple[dict[str, str], list[Slot], int]:
    """Fill, keeping room for what the fill offloads: a block on the main device, and on
    the CPU the tensors on their way to the disk (at most a read window of them, at most
    what goes there) and the pinned staging of what lands on CUDA (``pinned_of``). The
    room kept only grows, so it settles, and the pool follows what is on CUDA (the CPU's
    room doesn't change it); after a few passes the window's worth is kept whole. Also
    returns the pinned bytes the CPU was given: the pool of the result's CUDA share, or
    (should that pool not settle) at least it: the result is always the fill of the slots
    returned, and the CPU's room covers its pool."""
    keep_block, disk, pinned = False, (0, 0), 0
    for _ in range(PASSES):
        slots = _slots(strategy, budgets, inp, host, block if keep_block else 0, disk, pinned)
        result = fill(inp, slots)
        tensors = frozenset().union(*(inp.tensors(u) for u, d in result.items() if d == DISK))
        on_disk, buffers = inp.host_bytes_offloaded(tensors), inp.resident(tensors)
        needed = (keep_block or _offloads(result, budgets), (max(disk[0], min(window, on_disk)),
                  max(disk[1], min(window, on_disk - buffers))), pinned_of(result))
        if needed == (keep_block, disk, pinned):
            return result, slots, pinned
        keep_block, disk, pinned = needed
    for _ in range(PASSES):  # the room kept at its bound; the pool only grows
        slots = _slots(strategy, budgets, inp, host, block, (window, window), pinned)
        result = fill(inp, slots)
        if pinned_of(result) <= pinned:
            return result, slots, pinned
        pinned = pinned_of(result)
    slots = _slots(strategy, budgets, inp, host, block, (window, window), POOL_BOUND)
    return fill(inp, slots), slots, POOL_BOUND


def staging_of(steps: Iterable[Step], devices: DeviceMap | None) -> StagingPool:
    """The pinned pool a load's CUDA copies go through: sized by the tensors it allocates
    on a CUDA device (:func:`~weightplan.planner.inputs.device.staging_pool`). The
    executor's stager holds no more; an automatic placement counts the same pool in the
    CPU's budget."""
    if devices is None or not devices.uses_cuda:
        return StagingPool()
    return staging_pool(d.spec.nbytes for s in steps for d in s.destinations
                        if d.allocates and devices.device_for(d.key).type == "cuda")


def _copies(steps: Iterable[Step], canon: Mapping[str, str]) -> dict[str, int]:
    """Canonical name → bytes of the tensors the load allocates (copied to their device)."""
    return {canon.get(d.key, d.key): d.spec.nbytes for s in steps for d in s.destinations
            if d.allocates}


def _cuda(device: str) -> bool:
    return device not in (CPU, DISK) and torch.device(device).type == "cuda"


def fill_input(tree: ModuleTree, info: ModelInfo, steps: Iterable[Step],
               dtype: torch.dtype | None, threads: int) -> FillInput:
    """Per canonical tensor: its planned bytes (what the plan writes; the model's own init
    for the tensors the checkpoint lacks), its staging copy on an accelerator, and the host
    bytes it would hold on its way to the disk (none when referenced in place or streamed:
    :func:`~weightplan.planner.tensors.schedule.offload_plan.host_bytes_offloaded`)."""
    canon = {name: t.name for name, t in info.tensors.items()}
    size: dict[str, int] = {}
    temp: dict[str, int] = {}
    host: dict[str, int] = {}
    for step in steps:
        direct = not step.materialize and not step.quantized and all(r.direct for r in step.reads)
        widest = max((n.spec.dtype.itemsize for s in step.sources for n in s), default=1)
        for i, d in enumerate(step.destinations):
            if not d.written:
                continue
            name = canon.get(d.key, d.key)
            size[name] = d.spec.nbytes
            host[name] = host_bytes_offloaded(step, i)
            if not direct:
                fp8 = _fp8_reads(step, i)
                temp[name] = device_staging(fp8) if fp8 else \
                    d.spec.numel * max(widest, d.spec.dtype.itemsize)
    for t in info.unique():
        if t.name not in size:
            cast = dtype is not None and t.on_meta and t.spec.dtype.is_floating_point \
                and not t.keep_dtype
            size[t.name] = t.spec.numel * (dtype.itemsize if cast and dtype is not None
                                           else t.spec.dtype.itemsize)
    for name, nbytes in tree.extra_bytes.items():
        size.setdefault(canon.get(name, name), nbytes)
    return FillInput(tree, canon, size, temp, concurrent=max(1, threads), host_offloaded=host)


def _fp8_reads(step: Step, target: int) -> list[ReadTask]:
    """The block-FP8 reads dequantized into destination ``target`` (on its device when
    it is an accelerator: its staging is theirs, see dequant_side.py)."""
    return [r for r in step.reads if r.dequantize is not None and r.dequantize.scheme is None
            and isinstance(r.fragment, Fragment) and r.fragment.target == target]


def _slots(strategy: str, budgets: Sequence[DeviceBudget], inp: FillInput, host: HostCosts,
           kept: int, disk: tuple[int, int], pinned: int) -> list[Slot]:
    """``disk``: host bytes to the disk (a window) with its buffers (0: no block kept) and without."""
    caps = _balanced(strategy, budgets, inp)
    accelerators = [b for b in budgets if b.is_accelerator]
    slots = []
    for b in budgets:
        fixed, room = 0, 0
        if b.device == CPU:
            room = kept if disk[0] else 0  # (a disk block runs from the CPU's memory)
            fixed = host.temporaries + pinned + disk[1]
        elif accelerators and b is accelerators[0]:
            room = kept
        slots.append(Slot(b.device, caps.get(b.device, b.budget), fixed + room,
                          b.is_accelerator, room))
    return slots


def _balanced(strategy: str, budgets: Sequence[DeviceBudget], inp: FillInput
              ) -> dict[str, int | None]:
    """Accelerator capacities for the balanced strategies (all but the last capped)."""
    accelerators = [b for b in budgets if b.is_accelerator and b.budget]
    if strategy == "sequential" or len(accelerators) < 2:
        return {}
    total = inp.bytes_of(inp.tensors(""))
    low0 = strategy == "balanced_low_0"
    shared = accelerators[1:] if low0 else accelerators
    share = -(-total // len(shared)) + largest_whole(inp) + inp.staging_of(inp.temp)
    caps: dict[str, int | None] = {b.device: min(share, b.budget or 0) for b in shared[:-1]}
    if low0:
        rest = sum(caps.values()) + (shared[-1].budget or 0)  # type: ignore[arg-type]
        first = accelerators[0]
        caps[first.device] = min(first.budget or 0, max(0, total - rest))
    return caps


def _offloads(result: Mapping[str, str], budgets: Sequence[DeviceBudget]) -> bool:
    """Anything off the accelerators (when there are some), or on the disk."""
    used = set(result.values())
    return DISK in used or (CPU in used and any(b.is_accelerator for b in budgets))


def _largest_step(steps: Iterable[Step]) -> int:
    return max((sum(d.spec.nbytes for d in s.destinations if d.allocates) for s in steps), default=0)


def _uses(inp: FillInput, result: Mapping[str, str], slots: Sequence[Slot],
          budgets: Sequence[DeviceBudget]) -> tuple[DeviceUse, ...]:
    per: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for unit, device in result.items():
        per.setdefault(device, set()).update(inp.tensors(unit))
        counts[device] = counts.get(device, 0) + 1
    uses: list[DeviceUse] = []
    seen, buffers = set[str](), {inp.canon.get(n, n) for n in inp.tree.extra_bytes}
    for slot, b in zip(slots, budgets, strict=True):
        tensors = per.get(slot.device, set()) - seen
        seen |= tensors
        weights = inp.bytes_of(frozenset(tensors - buffers if slot.device == DISK else tensors))
        staging, resident = (inp.staging_of(tensors) if slot.accelerator else 0), 0
        if slot.device == CPU:  # the load's host side; the disk's buffers, held in memory, apart
            resident, staging = inp.bytes_of(frozenset(per.get(DISK, set()) & buffers)), slot.fixed - slot.kept
        kept = slot.kept if weights else 0  # (a device given nothing runs nothing)
        uses.append(DeviceUse(slot.device, b.budget, weights, staging, kept,
                              counts.get(slot.device, 0), b.present, resident))
    return tuple(uses)


def rehosted(placement: DevicePlacement, before: int, after: int) -> DevicePlacement:
    """``placement`` with the CPU's host temporaries those of the schedule that runs (``after``:
    nothing is read for the disk's tensors referenced in place) when fewer than ``before``."""
    uses = tuple(dataclasses.replace(u, staging=max(0, u.staging - before + min(before, after)))
                 if u.device == CPU else u for u in placement.uses)
    return dataclasses.replace(placement, uses=uses)


def check_budgets(placement: DevicePlacement) -> None:
    """A :class:`BudgetError` when a device's peak and room kept pass its ``max_memory``."""
    what = "device_map" if placement.strategy == "dict" else "automatic placement"
    for u in placement.uses:
        held = u.peak - u.resident + u.kept  # (resident buffers: counted apart)
        if u.budget is not None and held > u.budget:
            raise BudgetError(f"{what}: {u.device} would hold {format_bytes(held)} > its "
                              f"max_memory {format_bytes(u.budget)}", minimum_bytes=held)
