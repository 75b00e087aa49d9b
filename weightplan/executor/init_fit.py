"""Before a load allocates anything: the tensors it allocates fit where they go.

A config whose checkpoint lacks three 64 GB tensors would make the load allocate them (to
run the model's init on them) and end in an allocator error, or worse, in the kernel's
OOM killer once the init writes them. Before anything is read or allocated, the bytes a
load allocates on each device (the loaded tensors that were on meta, and the missing
ones the init fills, in the dtype asked for) are compared with what that device has
available (this machine's memory, as the plan's "fits in memory" line reads it; a CUDA
device's free memory). More than that is a :class:`BudgetError` that names the largest
missing tensors.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from weightplan.errors import BudgetError
from weightplan.planner.inputs.device import CPU, DeviceMap
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.schedule.machine import machine_memory
from weightplan.units import counted, format_bytes


def fresh_sizes(model: nn.Module, info: ModelInfo, names: Iterable[str],
                dtype: torch.dtype | None) -> dict[str, int]:
    """Bytes the init allocates for each missing meta tensor in ``names`` and each meta
    buffer (as :func:`~weightplan.executor.init.initialize_fresh` allocates them)."""
    sizes = {}
    for name in names:
        entry = info.get(name)
        if entry is None or not entry.on_meta:
            continue
        cast = dtype is not None and entry.spec.dtype.is_floating_point and not entry.keep_dtype
        itemsize = dtype.itemsize if cast and dtype is not None else entry.spec.dtype.itemsize
        sizes[name] = entry.spec.numel * itemsize
    for name in info.meta_buffers:
        buffer = model.get_buffer(name)
        sizes[name] = buffer.numel() * buffer.element_size()
    return sizes


def check_allocations_fit(fresh: dict[str, int], loaded: Iterable[Destination],
                          devices: DeviceMap | None) -> None:
    """:class:`BudgetError` when what the load allocates on a device exceeds what it has."""
    where = devices.device_for if devices is not None else (lambda _: CPU)
    per: dict[torch.device, list[int]] = {}  # device: [loaded bytes, fresh bytes]
    if devices is None:  # (all on the CPU: summed without a lookup per tensor)
        loads = [dest.spec.nbytes for dest in loaded if dest.allocates]
        if loads or fresh:
            per[CPU] = [sum(loads), sum(fresh.values())]
    else:
        for dest in loaded:
            if dest.allocates:
                per.setdefault(where(dest.key), [0, 0])[0] += dest.spec.nbytes
        for name, nbytes in fresh.items():
            per.setdefault(where(name), [0, 0])[1] += nbytes
    for device, (load, init) in per.items():
        available = _available(device)
        if init and available is not None and load + init > available:
            missing = {n: b for n, b in fresh.items() if where(n) == device}
            raise BudgetError(_message(device, load, missing, available),
                              minimum_bytes=load + init)


def _message(device: torch.device, load: int, missing: dict[str, int], available: int) -> str:
    names = sorted(missing, key=lambda n: -missing[n])
    largest = ", ".join(f"{n} ({format_bytes(missing[n])})" for n in names[:3])
    more = ", ..." if len(names) > 3 else ""
    return (f"the checkpoint lacks {counted(len(names), 'tensor')} the model's init would allocate: "
            f"{format_bytes(sum(missing.values()))} on {device} (largest: {largest}{more}), "
            f"plus {format_bytes(load)} of loaded tensors, but {device} has "
            f"{format_bytes(available)} available; nothing was allocated. Check that the "
            "config matches the checkpoint, or load to a device with room (device=...)")


def _available(device: torch.device) -> int | None:
    """Bytes ``device`` can still take: this machine's available memory for the CPU, the
    free memory of a CUDA device; ``None`` when unknown (meta, disk, other devices)."""
    if device.type == "cpu":
        memory = machine_memory()
        return None if memory is None else memory.available
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return None
