"""Saving a tensor-parallel model: gather one tensor at a time, write on one rank.

Every rank runs the same write schedule, inline (threads=0), so the collectives behind
``DTensor.full_tensor()`` happen in the same order everywhere. Reads of a ``DTensor``
gather it when a step first needs it and keep only that one gathered tensor (the next
key evicts it): memory stays bounded by the largest converter group, never a full
state dict. Rank 0 writes through the ordinary file sink (same atomic commit); the other
ranks' writes go to :class:`DiscardSink`. A barrier at the end lets no rank return before
the files are committed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View


def has_dtensors(checkpoint: Checkpoint) -> bool:
    """Whether the tensors saved are a tensor-parallel model's. Files (a convert) have none,
    and no ``DTensor`` exists before ``torch.distributed.tensor`` is imported: importing it
    only to ask held ~33 MiB more (a convert's RSS over its planned peak)."""
    if checkpoint.tensors is None or "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in checkpoint.tensors.values())


class GatheredTensors(Mapping[str, torch.Tensor]):
    """A ``{key: tensor}`` view that gathers ``DTensor`` values on access, one at a time."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self._tensors = tensors
        self._last: tuple[str, torch.Tensor] | None = None

    def __getitem__(self, key: str) -> torch.Tensor:
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        tensor = self._tensors[key]
        if hasattr(tensor, "full_tensor"):
            self._last = None  # free the previous one before gathering the next
            tensor = tensor.full_tensor().detach()
            self._last = (key, tensor)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def gathering(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` whose in-memory DTensors are gathered when read."""
    assert checkpoint.tensors is not None
    return dataclasses.replace(checkpoint, tensors=GatheredTensors(checkpoint.tensors))


class DiscardSink:
    """The sink of the ranks that don't write: every write is dropped."""

    def open(self, dest: Destination) -> None:
        return None

    def write_bytes(self, handle: Any, dest: Destination, offset: int, data: torch.Tensor) -> None:
        return None

    def byte_view(self, handle: Any, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        return None

    def file_region(self, handle: Any, dest: Destination, offset: int) -> tuple[int, int, str] | None:
        return None

    def write_view(self, handle: Any, dest: Destination, view: View, src: torch.Tensor) -> None:
        return None

    def update_view(self, handle: Any, dest: Destination, view: View) -> torch.Tensor | None:
        return None

    def close(self, dest: Destination, handle: Any) -> None:
        return None

    def commit(self) -> None:
        return None

    def abort(self) -> None:
        return None


def writer_rank() -> tuple[bool, bool]:
    """(distributed, this rank writes): rank 0 of the default group writes."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False, True
    return True, dist.get_rank() == 0


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()
