"""Automatic placement in the load pipeline: ``device="auto"`` (transformers' ``device_map``
words) with ``max_memory`` and ``offload_folder``.

The graph and the schedule don't depend on where tensors land (reads, ops and casts run
on the host; only the last copy goes to a device), so the load is planned first and
placed after, from its own sizes (:mod:`~weightplan.planner.tensors.schedule.device_plan`).
The placement becomes the plan's :class:`~weightplan.planner.inputs.device.DeviceMap`:
the executor allocates by it, and ``"disk"`` prefixes load through the CPU into
``offload_folder``, except the tensors the checkpoint holds as they are: those are
referenced in place and their steps leave the schedule
(:mod:`~weightplan.planner.tensors.schedule.offload_plan`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from weightplan.errors import ParallelError, PlanError
from weightplan.planner.core.problems import Note
from weightplan.planner.inputs.device import parse_device, placed_map
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.inputs.module_tree import ModuleTree, module_tree
from weightplan.planner.pipelines.plan import PlanOptions
from weightplan.planner.tensors.schedule.device_budgets import (
    CPU, DISK, DeviceBudget, device_name, parse_max_memory,
)
from weightplan.planner.tensors.schedule.device_plan import (
    STRATEGIES, DevicePlacement, HostCosts, check_budgets, given_placement, place_devices,
    rehosted,
)
from weightplan.planner.tensors.schedule.offload_plan import OffloadPlan, plan_offload
from weightplan.planner.tensors.schedule.schedule import Schedule, make_schedule
from weightplan.units import format_bytes

WINDOW_SHARE = 8  # the read-ahead window is at most 1/8 of the CPU's max_memory


@dataclass(frozen=True)
class AutomaticRequest:
    """``device="auto"`` & co., checked before anything is planned."""

    strategy: str
    budgets: tuple[DeviceBudget, ...]
    offload_folder: str | None
    given: tuple[tuple[str, str], ...] | None = None  # a dict map naming "disk": as given

    def placed(self, options: PlanOptions, model: torch.nn.Module, info: ModelInfo | None,
               schedule: Schedule) -> tuple[PlanOptions, Schedule, tuple[Note, ...]]:
        """``options`` with the placement and the device map made from it, the
        schedule (its read-ahead window bounded by the CPU's budget), and a note when the
        budgets left nothing resident (:meth:`resident_note`)."""
        if info is None:
            raise PlanError("automatic placement needs a model")
        unbounded = schedule
        schedule = self.windowed(schedule)
        host = host_costs(schedule)
        tree = module_tree(model)
        if self.given is not None:
            placement = given_placement(self.given, tree, info, schedule, options.dtype, host,
                                        self.offload_folder, self.budgets)
            _check_split_ties(placement, info)
        else:
            placement = place_devices(self.strategy, self.budgets, tree, info, schedule,
                                      options.dtype, host, self.offload_folder)
        notes = self.resident_note(placement, options, tree, info, unbounded)
        devices = placed_map(placement.device_map, self.offload_folder)
        if devices.disk:
            offload, steps = plan_offload(schedule.steps, devices, info)
            _needs_folder(offload, placement)
            schedule = make_schedule(steps, threads=schedule.threads,
                                     window_bytes=schedule.window_bytes)
            placement = rehosted(dataclasses.replace(placement, offload=offload),
                                 host.temporaries, host_costs(schedule).temporaries)
        check_budgets(placement)
        return (dataclasses.replace(options, devices=devices, placement=placement), schedule,
                notes + resident_buffers(placement, tree))

    def resident_note(self, placement: DevicePlacement, options: PlanOptions,
                      tree: ModuleTree, info: ModelInfo, schedule: Schedule
                      ) -> tuple[Note, ...]:
        """Budgets too small for even the first module put the whole model on the disk,
        read back at every forward: a note naming the smallest budget of the first device
        that keeps that module resident (the fill's own arithmetic; a larger budget also
        widens the CPU's read window, so it is placed again until it holds)."""
        if placement.resident_need is None:
            return ()
        device, unit, need = placement.resident_need
        budget = next(b.budget for b in self.budgets if b.device == device)
        tried, keeps = placement, ""
        while tried.resident_need is not None:  # (the need only grows: it settles)
            need = max(need, tried.resident_need[2])
            budgets = tuple(dataclasses.replace(b, budget=need) if b.device == device else b
                            for b in self.budgets)
            wider = dataclasses.replace(self, budgets=budgets).windowed(schedule)
            tried = place_devices(self.strategy, budgets, tree, info, wider,
                                  options.dtype, host_costs(wider), self.offload_folder)
            if tried.resident_need is not None and tried.resident_need[2] <= need:
                break  # (a fill that keeps nothing at its own need: no number to give)
        else:
            keeps = (f"; a budget of {need} bytes ({format_bytes(need)}) for {device} in "
                     "max_memory keeps it resident")
        return (Note("max_memory", f"max_memory leaves nothing resident: "
                     f"{unit or 'the model'}, the first module placed, doesn't fit {device}'s "
                     f"{format_bytes(budget or 0)} beside what the load and an offloaded block "
                     "take there, so the whole model goes to the disk and is read back at "
                     f"every forward{keeps}"),)

    def windowed(self, schedule: Schedule) -> Schedule:
        """Reads in flight (and tensors on their way to the disk) take host memory: the
        window is at most :data:`WINDOW_SHARE` of the CPU's ``max_memory``."""
        cpu = next((b.budget for b in self.budgets if b.device == CPU), None)
        if cpu is None or cpu // WINDOW_SHARE >= schedule.window_bytes:
            return schedule
        return make_schedule(schedule.steps, threads=schedule.threads,
                             window_bytes=cpu // WINDOW_SHARE)


def resident_buffers(placement: DevicePlacement, tree: ModuleTree) -> tuple[Note, ...]:
    """The non-persistent buffers of the modules placed on the disk (rotary ``inv_freq``):
    no checkpoint holds them, the model's init makes them, and accelerate's hooks keep
    buffers in memory where the modules run; counted apart (said here), not against the
    disk nor any ``max_memory``."""
    kept = sorted(b for b in tree.extra_bytes if placement.device_of(b) == DISK)
    if not kept:
        return ()
    total = sum(tree.extra_bytes[b] for b in kept)
    shown = ", ".join(kept[:3]) + (f", … ({len(kept)})" if len(kept) > 3 else "")
    return (Note("buffers", f"{format_bytes(total)} of non-persistent buffers ({shown}) of "
                 f"the modules placed on the disk stay in memory on {placement.main_device}, "
                 "where those modules run: they are no checkpoint tensors (the model's init "
                 "makes them; accelerate keeps buffers resident), so max_memory doesn't "
                 "count them"),)


def host_costs(schedule: Schedule) -> HostCosts:
    """The schedule's host temporaries and its read window (the pinned staging pool depends
    on what the placement puts on CUDA: counted by it)."""
    temporaries = max((p.in_flight + p.intermediate for p in schedule.timeline), default=0)
    return HostCosts(temporaries, schedule.window_bytes)


def automatic_request(device: object, max_memory: object, offload_folder: object,
                      model: torch.nn.Module | None, tp: object) -> AutomaticRequest | None:
    """The request when ``device`` names a strategy, or is a dict map putting modules on
    ``"disk"`` (placed as given), else ``None``.

    Raises:
        PlanError: ``max_memory`` without a strategy or a disk entry (or naming a device
            such a map doesn't use), ``offload_folder`` without one or a disk entry, no
            model, a model with allocated tensors, a folder that is a file,
            a device of a dict map that isn't one (or that this machine lacks).
        ParallelError: with ``tp=`` (exclusive, as in transformers).
    """
    given = _given(device)
    if given is not None:
        if tp is not None:
            raise ParallelError("tp= places each rank's part on its own device: a dict map "
                                "putting modules on 'disk' can't go with it (exclusive, as "
                                "in transformers): drop tp=, or the 'disk' entries")
        _meta_model(model, "a dict device_map with 'disk' entries")
        return AutomaticRequest("dict", _given_budgets(given, max_memory),
                                _folder(offload_folder), given)
    if not (isinstance(device, str) and device in STRATEGIES):
        if max_memory is not None or offload_folder is not None:
            raise PlanError("max_memory and offload_folder size an automatic placement "
                            "(device_map='auto', 'balanced', 'balanced_low_0' or 'sequential') "
                            "or bound a dict map naming \"disk\": pass one of those, or drop "
                            "them")
        return None
    if tp is not None:
        raise ParallelError("tp= places each rank's part on its own device: drop "
                            f"device_map={device!r} (exclusive, as in transformers)")
    _meta_model(model, f"device_map={device!r}")
    folder = _folder(offload_folder)
    if max_memory is not None and not isinstance(max_memory, Mapping):
        raise PlanError(f"max_memory must be a dict {{device: size}}, got {max_memory!r}")
    return AutomaticRequest(device, parse_max_memory(max_memory), folder)


def _check_split_ties(placement: DevicePlacement, info: ModelInfo) -> None:
    """A tie is one tensor: a given map putting one of its names on the disk and another in
    memory is refused (accelerate's hooks don't read it back: transformers' load with the
    same map fails at the dispatch or at the forward; its automatic maps keep ties on one
    device). A trainable-token layer's tie is left to the adapter's own refusal.

    Raises:
        PlanError: naming both tensors, their devices and what to map instead."""
    seen: set[str] = set()
    for spec in info.tensors.values():
        if spec.name in seen or len(spec.aliases) < 2:
            continue
        seen.add(spec.name)
        devices = {name: placement.device_of(name) for name in spec.aliases}
        if DISK not in devices.values() or len(set(devices.values())) == 1 \
                or any(".token_adapter." in name for name in devices):
            continue
        disk = next(n for n, d in devices.items() if d == DISK)
        other, where = next((n, d) for n, d in devices.items() if d != DISK)
        modules = " and ".join(sorted(n.rpartition(".")[0] for n in (disk, other)))
        raise PlanError(f"device_map puts {disk} on 'disk' and {other}, tied to it (one tensor), "
                        f"on {where!r}: accelerate's hooks can't run a tie split between memory "
                        "and the disk (transformers' load with this map fails at the dispatch or "
                        f"the forward); map {modules} to the same device (both on 'disk', or both "
                        "in memory)")


def _needs_folder(offload: OffloadPlan, placement: DevicePlacement) -> None:
    """As transformers: the disk's tensors the checkpoint holds as they are are read back
    from it in place (no folder); a converted one must be written to ``offload_folder``.

    Raises:
        PlanError: a tensor to write and no ``offload_folder`` (names them, and why).
    """
    written = [t for t in offload.tensors if not t.referenced]
    if offload.folder is not None or not written:
        return
    rest = [u or "the whole model" for u, d in placement.device_map if d == DISK]
    shown = ", ".join(rest[:4]) + (f", ... ({len(rest)} modules)" if len(rest) > 4 else "")
    names = ", ".join(t.name for t in written[:3]) + (" ..." if len(written) > 3 else "")
    why = f"the map puts {shown}" if placement.strategy == "dict" else \
        f"the devices in max_memory can't hold the model, the rest ({shown}) goes"
    raise PlanError(f"device_map: {why} to the disk, where {len(written)} tensors ({names}: "
                    f"{written[0].why_written}) are converted, not read back from the "
                    "checkpoint as they are: pass offload_folder= (a directory), or give the "
                    "devices more memory")


def _meta_model(model: torch.nn.Module | None, what: str) -> None:
    """A placement allocates the parameters on their devices: they must be on meta. Real
    buffers (``init_empty()`` keeps them, persistent ones included: DeepSeek-V3's
    ``e_score_correction_bias``) move to their module's device and are loaded there."""
    if model is None:
        raise PlanError(f"{what} places a model's modules: pass the model")
    allocated = next(((n, t) for n, t in model.named_parameters() if not t.is_meta), None)
    if allocated is not None:
        raise PlanError(f"{what} places a model built on meta (weightplan.init_empty()); "
                        f"{allocated[0]} is already allocated on {allocated[1].device}")


def _given(device: object) -> tuple[tuple[str, str], ...] | None:
    """A dict map with ``"disk"`` entries as (prefix, device name) pairs (its devices
    checked against this machine), else ``None``."""
    if not isinstance(device, Mapping) or DISK not in device.values():
        return None
    keys = [k for k in device if not isinstance(k, str)]
    if keys:
        raise PlanError(f"device map keys are module prefixes (str), got {keys[0]!r}")
    on = parse_device({k: v for k, v in device.items() if v != DISK})
    assert on is not None
    return tuple((k.strip("."), DISK if v == DISK else device_name(on.device_for(k.strip("."))))
                 for k, v in device.items())


def _given_budgets(given: tuple[tuple[str, str], ...], max_memory: object
                   ) -> tuple[DeviceBudget, ...]:
    """``max_memory`` beside a dict map naming ``"disk"``: each budget bounds a device the
    map uses (its planned peak is checked; nothing is moved). The CPU is always used: what
    goes to the disk or a GPU is read through it.

    Raises:
        PlanError: a budget for a device the map puts nothing on (it would bound nothing).
    """
    if max_memory is None:
        return ()
    budgets = tuple(b for b in parse_max_memory(max_memory)
                    if b.budget is not None or b.device != DISK)
    used = {d for _, d in given} | {CPU}
    unused = [b.device for b in budgets if b.device not in used]
    if unused:
        raise PlanError(f"max_memory names {unused[0]}, where the map puts nothing (it "
                        f"uses {', '.join(sorted(used))}): drop it from max_memory, or map "
                        "modules to it")
    return budgets


def _folder(offload_folder: object) -> str | None:
    if offload_folder is None:
        return None
    if not isinstance(offload_folder, (str, os.PathLike)):
        raise PlanError(f"offload_folder must be a path, got {offload_folder!r}")
    folder = os.fspath(offload_folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise PlanError(f"offload_folder {folder} exists and is not a directory")
    return str(folder)
