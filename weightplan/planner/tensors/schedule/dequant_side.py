"""Where each FP8 dequantize runs: on the host before the copy, or on the destination's
device after it.

A block-FP8 weight dequantized on the host crosses the bus as bf16 (2 bytes an element);
dequantized on the device, its FP8 bytes and scale tiles cross (1 byte an element, plus
the tiles) and the device widens and scales them into the destination view. The choice
is per destination, made from the plan's device map once the placement is known:

- ``"auto"`` (default): on the device when the destination is an accelerator, else on
  the host;
- ``"host"``: always on the host;
- ``"device"``: wherever it can run there (a CPU destination then runs the device
  kernel on its own memory: the same code path, the CPU standing in for the device).

It can run on the device when the read lands whole in a fresh destination (a placed
fragment the region's shape; not an input of ops run on tensors, not a packed format,
not a tensor on its way to the disk). Memory: the host holds the FP8 region and the tiles
(its read); the device holds, besides the destination, the FP8 region, the tiles and one
fp32 workspace (:func:`device_staging`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from weightplan.errors import PlanError
from weightplan.planner.core.geometry import Fragment
from weightplan.planner.core.quant.blocks import DEQUANTIZE_BYTES, workspace_bytes
from weightplan.planner.inputs.device import CPU, DeviceMap
from weightplan.planner.tensors.lower.placement import Step
from weightplan.planner.tensors.lower.read_tasks import ReadTask
from weightplan.planner.tensors.schedule.schedule import Schedule, make_schedule

MODES = ("auto", "host", "device")
HOST, DEVICE = "host", "device"


@dataclass(frozen=True, slots=True)
class DequantSite:
    """One destination's dequantize: where it runs, and the bytes on each side."""

    key: str  # the model tensor
    device: str  # the destination's device
    side: str  # HOST or DEVICE
    fp8_bytes: int  # the FP8 regions read (held on the host while read)
    scale_bytes: int  # their scale tiles
    out_bytes: int  # the dequantized values (the destination's bytes written)

    @property
    def bus_bytes(self) -> int:
        """Bytes copied host → device (0 when the destination is the CPU)."""
        if self.device == str(CPU):
            return 0
        return self.fp8_bytes + self.scale_bytes if self.side == DEVICE else self.out_bytes


@dataclass(frozen=True)
class DequantPlacement:
    """Every FP8 dequantize of the plan, sided (the sites are read off the steps when
    asked: a plan that loads onto the CPU pays nothing for them at plan time)."""

    mode: str
    steps: tuple[Step, ...] = field(repr=False)
    devices: DeviceMap | None = field(repr=False)

    @property
    def accelerated(self) -> bool:
        """Some destination is on an accelerator (the side then matters)."""
        return self.devices is not None and any(d.type != "cpu" for d in self.devices.devices)

    @cached_property
    def sites(self) -> tuple[DequantSite, ...]:
        return tuple(_site(step, t, self.devices, t in step.device_dequantize)
                     for step in self.steps for t in sorted(_fp8_targets(step)))

    def count(self, side: str) -> int:
        return sum(s.side == side for s in self.sites)

    def bytes_on(self, side: str, what: str) -> int:
        """Sum of ``what`` (``fp8_bytes``, ``scale_bytes``, ``out_bytes``, ``bus_bytes``)
        over the sites dequantized on ``side``."""
        return sum(getattr(s, what) for s in self.sites if s.side == side)


def check_mode(mode: object) -> str:
    """Raises:
        PlanError: not one of :data:`MODES`."""
    if mode not in MODES:
        raise PlanError(f"dequantize_on={mode!r}: one of {', '.join(map(repr, MODES))}")
    return str(mode)


def place_dequantize(schedule: Schedule, devices: DeviceMap | None, mode: str
                     ) -> tuple[Schedule, DequantPlacement]:
    """The schedule with each step's device-side destinations set, and the placement."""
    if mode == "auto" and (devices is None or all(d.type == "cpu" for d in devices.devices)):
        return schedule, DequantPlacement(mode, schedule.steps, devices)  # (all on the host)
    steps: list[Step] = []
    changed = False
    for step in schedule.steps:
        targets = _fp8_targets(step)
        on_device = frozenset(t for t in targets if _side(step, t, devices, mode) == DEVICE) \
            if targets else frozenset()
        if on_device != step.device_dequantize:
            step, changed = dataclasses.replace(step, device_dequantize=on_device), True
        steps.append(step)
    if changed:
        schedule = make_schedule(tuple(steps), threads=schedule.threads,
                                 window_bytes=schedule.window_bytes)
    return schedule, DequantPlacement(mode, schedule.steps, devices)


def device_staging(reads: Iterable[ReadTask]) -> int:
    """Device bytes besides the destination while its dequantizes run there: the FP8
    regions, their tiles and one fp32 workspace (the largest a read needs)."""
    reads = [r for r in reads if r.dequantize is not None]
    work = max((workspace_bytes(r.region.shape, r.dequantize.block,  # type: ignore[union-attr]
                                per_element=DEQUANTIZE_BYTES) for r in reads), default=0)
    return sum(r.region.numel * r.entry.spec.dtype.itemsize + r.scale_bytes
               for r in reads) + work


def _fp8_targets(step: Step) -> set[int]:
    return {r.fragment.target for r in step.reads
            if r.dequantize is not None and r.dequantize.scheme is None
            and isinstance(r.fragment, Fragment)}


def _side(step: Step, target: int, devices: DeviceMap | None, mode: str) -> str:
    dest = step.destinations[target]
    reads = [r for r in step.reads if isinstance(r.fragment, Fragment)
             and r.fragment.target == target]
    whole = dest.allocates and all(
        r.dequantize is not None and r.dequantize.scheme is None
        and tuple(r.fragment.view.shape) == tuple(r.region.shape)  # type: ignore[union-attr]
        for r in reads) and not any(r.fragment is None for r in step.reads)
    if mode == HOST or not whole or (devices is not None and devices.offloads(dest.key)):
        return HOST
    if mode == DEVICE:
        return DEVICE
    device = devices.device_for(dest.key) if devices is not None else CPU
    return HOST if device.type == "cpu" else DEVICE


def _site(step: Step, target: int, devices: DeviceMap | None, on_device: bool) -> DequantSite:
    dest = step.destinations[target]
    reads = [r for r in step.reads if r.dequantize is not None
             and isinstance(r.fragment, Fragment) and r.fragment.target == target]
    device = devices.device_for(dest.key) if devices is not None else CPU
    return DequantSite(dest.key, str(device), DEVICE if on_device else HOST,
                       sum(r.region.numel * r.entry.spec.dtype.itemsize for r in reads),
                       sum(r.scale_bytes for r in reads),
                       sum(r.region.numel * dest.spec.dtype.itemsize for r in reads))
