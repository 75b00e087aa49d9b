"""Where each model tensor is loaded: one device, or a device per module prefix.

``device="cuda:1"``, ``torch.device("cpu")``, ``0`` (CUDA ordinal), or
``{"model.layers.0": "cuda:0", "lm_head": "cuda:1", "": "cpu"}``: the longest prefix
(whole dotted components) that starts a tensor's name decides; names no prefix covers go
to ``""`` when given, else to the CPU. ``None`` keeps the default (CPU for meta
tensors, and an allocated tensor is written where it already is).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from weightplan.errors import PlanError
from weightplan.units import counted

CPU = torch.device("cpu")
STAGING_CHUNK = 32 << 20  # bytes per pinned host buffer CUDA copies go through, at most
STAGING_BUFFERS = 8  # buffers in the pool, at most: host staging is at most their product


@dataclass(frozen=True)
class StagingPool:
    """The pinned host buffers copies to an accelerator go through: ``buffers`` of
    ``chunk`` bytes (a larger copy goes through in chunks)."""

    chunk: int = 0
    buffers: int = 0

    @property
    def nbytes(self) -> int:
        return self.chunk * self.buffers


def staging_pool(copies: Iterable[int]) -> StagingPool:
    """The pool for host → accelerator copies of these byte sizes (one per tensor): buffers
    the size of the largest copy (at most :data:`STAGING_CHUNK`), as many as the copies
    fill (at most :data:`STAGING_BUFFERS`, at least one): never more than the bytes moved,
    nothing when nothing is moved."""
    sizes = [n for n in copies if n > 0]
    if not sizes:
        return StagingPool()
    chunk = min(STAGING_CHUNK, max(sizes))
    return StagingPool(chunk, max(1, min(STAGING_BUFFERS, sum(sizes) // chunk)))


@dataclass(frozen=True)
class DeviceMap:
    """Devices by module prefix (``""``: everything else)."""

    prefixes: tuple[tuple[str, torch.device], ...]  # longest first
    disk: frozenset[str] = frozenset()  # prefixes offloaded to the disk (loaded via the CPU)
    offload_folder: str | None = None  # where their tensors are written

    def device_for(self, name: str) -> torch.device:
        for prefix, device in self.prefixes:
            if not prefix or name == prefix or name.startswith(prefix + "."):
                return device
        return CPU

    def offloads(self, name: str) -> bool:
        """``name`` is offloaded to the disk (written to ``offload_folder``, not kept)."""
        for prefix, _ in self.prefixes:
            if not prefix or name == prefix or name.startswith(prefix + "."):
                return prefix in self.disk
        return False

    @property
    def devices(self) -> frozenset[torch.device]:
        return frozenset(d for _, d in self.prefixes)

    @property
    def uses_cuda(self) -> bool:
        return any(d.type == "cuda" for d in self.devices)


def parse_device(device: object) -> DeviceMap | None:
    """``device=`` as given to explain → a :class:`DeviceMap` (``None`` stays ``None``).

    Raises:
        PlanError: not a device, an unknown device string, a device this machine doesn't
            have (``cuda`` without CUDA, an ordinal past the device count), or ``meta``.
    """
    if device is None:
        return None
    if isinstance(device, Mapping):
        pairs = [(_prefix(k), _one(v, f"device[{k!r}]")) for k, v in device.items()]
    else:
        pairs = [("", _one(device, "device"))]
    return DeviceMap(tuple(sorted(pairs, key=lambda p: -len(p[0]))))


def placed_map(pairs: tuple[tuple[str, str], ...], offload_folder: str | None) -> DeviceMap:
    """An automatic placement's ``(prefix, device)`` pairs as a :class:`DeviceMap`: not
    checked against this machine (a dry run may name devices it lacks); ``"disk"``
    prefixes load through the CPU and are written to ``offload_folder``."""
    disk = frozenset(p for p, d in pairs if d == "disk")
    devices = [(p, CPU if d == "disk" else torch.device(d)) for p, d in pairs]
    return DeviceMap(tuple(sorted(devices, key=lambda p: -len(p[0]))), disk, offload_folder)


def offload_file(folder: str, key: str) -> str:
    """The safetensors file an offloaded tensor is written to (one per tensor, named by it:
    model names are dotted identifiers)."""
    return os.path.join(folder, f"{key}.safetensors")


def _prefix(key: object) -> str:
    if not isinstance(key, str):
        raise PlanError(f"device map keys are module prefixes (str), got {key!r}")
    return key.strip(".")


def _one(value: object, what: str) -> torch.device:
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise PlanError(f"{what} must be a device string, a torch.device or a CUDA ordinal, "
                        f"got {value!r}")
    try:
        device = torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
    except (RuntimeError, ValueError) as e:
        raise PlanError(f"{what}={value!r} is not a device: {e}") from e
    if device.type == "meta":
        raise PlanError(f"{what}={value!r}: loading onto meta keeps nothing; use a real device")
    if device.type == "cuda":
        _check_cuda(device, what)
    return device


def _check_cuda(device: torch.device, what: str) -> None:
    if not torch.cuda.is_available():
        raise PlanError(f"{what}={str(device)!r} but CUDA is not available here; load on "
                        "'cpu' or install a CUDA build of torch")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise PlanError(f"{what}={str(device)!r} but this machine has "
                        f"{counted(torch.cuda.device_count(), 'CUDA device')}")
