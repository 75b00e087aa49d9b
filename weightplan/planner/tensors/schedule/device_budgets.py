"""``max_memory`` as automatic placement reads it: an ordered list of devices and budgets.

transformers' and accelerate's words: ``{0: "20GiB", "cuda:1": "20GiB", "cpu": "64GiB"}``
(an int is a CUDA ordinal), values in bytes or strings. Devices are filled in this order:
accelerators by (type, index), then ``"cpu"``, then ``"disk"`` (always last, unbounded
unless given). Devices this machine doesn't have are kept (a dry run plans for them) and
marked absent: such a plan explains but doesn't execute. Without ``max_memory``: 90% of each
present CUDA device's free memory (the rest for the CUDA context and the allocator's
slack, as accelerate keeps for one GPU), this machine's available memory for the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from weightplan.errors import PlanError
from weightplan.planner.tensors.schedule.machine import machine_memory
from weightplan.units import parse_bytes

CPU, DISK = "cpu", "disk"
DETECTED_FRACTION = 0.9  # of a CUDA device's free memory, when max_memory isn't given


@dataclass(frozen=True, slots=True)
class DeviceBudget:
    """One device automatic placement may fill."""

    device: str  # "cuda:0", "cpu", "disk"
    budget: int | None  # bytes; None: unbounded (disk)
    present: bool  # this machine has it

    @property
    def is_accelerator(self) -> bool:
        return self.device not in (CPU, DISK)


def device_name(key: object) -> str:
    """A ``max_memory`` key as a device name: ``0`` → ``"cuda:0"``, ``"cuda"`` →
    ``"cuda:0"``, ``"cpu"``, ``"disk"``.

    Raises:
        PlanError: not a device (or ``meta``).
    """
    if key == DISK:
        return DISK
    if isinstance(key, bool) or not isinstance(key, (int, str, torch.device)):
        raise PlanError(f"max_memory keys are devices ('cuda:0', 0, 'cpu', 'disk'), got {key!r}")
    try:
        device = torch.device("cuda", key) if isinstance(key, int) else torch.device(key)
    except (RuntimeError, ValueError) as e:
        raise PlanError(f"max_memory key {key!r} is not a device: {e}") from e
    if device.type == "meta":
        raise PlanError("max_memory: 'meta' holds nothing; name real devices")
    if device.type == "cpu":
        return CPU
    return f"{device.type}:{device.index or 0}"


def parse_max_memory(max_memory: object) -> tuple[DeviceBudget, ...]:
    """The devices to fill, in order, with their budgets (see the module docstring).

    Raises:
        PlanError: a key that isn't a device, a device named twice, a budget that isn't a
            size.
    """
    if max_memory is None:
        return detected_budgets()
    if not isinstance(max_memory, Mapping):
        raise PlanError(f"max_memory must be a dict {{device: size}}, got {max_memory!r}")
    budgets: dict[str, int] = {}
    for key, value in max_memory.items():
        name = device_name(key)
        if name in budgets:
            raise PlanError(f"max_memory names {name} twice ({key!r})")
        budgets[name] = parse_bytes(value, what=f"max_memory[{key!r}]")
    ordered = sorted((n for n in budgets if n not in (CPU, DISK)), key=_accelerator_order)
    out = [DeviceBudget(n, budgets[n], _present(n)) for n in ordered]
    if CPU in budgets:
        out.append(DeviceBudget(CPU, budgets[CPU], True))
    out.append(DeviceBudget(DISK, budgets.get(DISK), True))
    return tuple(out)


def detected_budgets() -> tuple[DeviceBudget, ...]:
    """This machine's devices: free CUDA memory (a fraction), available host memory."""
    out = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, _ = torch.cuda.mem_get_info(i)
            out.append(DeviceBudget(f"cuda:{i}", int(free * DETECTED_FRACTION), True))
    memory = machine_memory()
    if memory is not None:
        out.append(DeviceBudget(CPU, memory.available, True))
    out.append(DeviceBudget(DISK, None, True))
    return tuple(out)


def _accelerator_order(name: str) -> tuple[str, int]:
    kind, _, index = name.partition(":")
    return kind, int(index or 0)


def _present(name: str) -> bool:
    kind, _, index = name.partition(":")
    if kind == "cuda":
        return torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count()
    accelerator = getattr(torch, kind, None)
    available = getattr(accelerator, "is_available", None)
    return bool(available()) if callable(available) else False
