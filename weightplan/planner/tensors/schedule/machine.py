"""The machine a plan runs on: its memory, compared with the plan's peak, and the default
read-ahead window.

Memory comes from ``/proc/meminfo`` (``MemTotal``, ``MemAvailable``), else from
``os.sysconf`` (total and free physical pages); no psutil. A plan whose peak exceeds what
is available says so plainly, with the smallest budget that would load it (the model
itself is the floor: a model larger than the machine can't be loaded into its memory by
any schedule).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from weightplan.units import format_bytes

DEFAULT_WINDOW_BYTES = 256 * 1024 * 1024
MEMINFO = "/proc/meminfo"


@dataclass(frozen=True, slots=True)
class MachineMemory:
    """Physical memory of this machine, in bytes."""

    total: int
    available: int


def machine_memory(meminfo: str = MEMINFO) -> MachineMemory | None:
    """This machine's memory, or ``None`` when neither source can tell."""
    try:
        with open(meminfo) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        total = int(fields["MemTotal"].split()[0]) * 1024
        available = int(fields.get("MemAvailable", fields["MemFree"]).split()[0]) * 1024
        return MachineMemory(total, available)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return MachineMemory(os.sysconf("SC_PHYS_PAGES") * page,
                             os.sysconf("SC_AVPHYS_PAGES") * page)
    except (OSError, ValueError, AttributeError):
        return None


def default_window_bytes(memory: MachineMemory | None = None) -> int:
    """Read-ahead bytes in flight by default: 256 MiB, less on a small machine (1/32 of
    its memory), never the size of the largest group."""
    memory = memory if memory is not None else machine_memory()
    if memory is None:
        return DEFAULT_WINDOW_BYTES
    return min(DEFAULT_WINDOW_BYTES, max(1 << 20, memory.total // 32))


@dataclass(frozen=True, slots=True)
class Fit:
    """How a plan's peak compares with the machine."""

    peak: int
    model: int  # bytes of model tensors: no schedule holds less
    memory: MachineMemory | None
    minimum: int | None = None  # the smallest peak any schedule has (when it was needed)

    @property
    def fits(self) -> bool | None:
        return None if self.memory is None else self.peak <= self.memory.available

    def describe(self) -> str:
        if self.memory is None:
            return "machine memory: unknown (no /proc/meminfo or sysconf)"
        m = self.memory
        here = (f"this machine has {format_bytes(m.total)} "
                f"({format_bytes(m.available)} available)")
        if self.fits:
            return f"fits in memory: peak {format_bytes(self.peak)}; {here}"
        if self.model > m.available:
            return (f"DOES NOT FIT: peak {format_bytes(self.peak)} and the model alone is "
                    f"{format_bytes(self.model)}, but {here}; no budget can load it into "
                    "this machine's memory (load to a device, shard it, or quantize)")
        if self.minimum is not None and self.minimum > m.available:
            return (f"DOES NOT FIT: peak {format_bytes(self.peak)}, and the smallest any "
                    f"schedule needs is {format_bytes(self.minimum)}, but {here}")
        smallest = "" if self.minimum is None else (
            f"; the smallest budget that works is {format_bytes(self.minimum)}")
        return (f"DOES NOT FIT as planned: peak {format_bytes(self.peak)}, but {here}; "
                f"explain with budget={format_bytes(m.available)!r} to fit{smallest}")

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak, "model_bytes": self.model, "fits": self.fits,
                "minimum_bytes": self.minimum,
                "total_bytes": None if self.memory is None else self.memory.total,
                "available_bytes": None if self.memory is None else self.memory.available}
