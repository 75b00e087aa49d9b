"""The write directions' plan: a checkpoint to write (saving a model, converting on disk).

Same pipeline as a load plan, read in the other direction: sources are the model's
tensors (or a checkpoint on disk), the conversions are built by the same builder with
file sinks, lowered, verified and scheduled by the same code, and written by the same
executor into a streaming, atomic file sink laid out in advance
(:mod:`weightplan.planner.write.shards`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from weightplan.planner.core.problems import Note
from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.tensors.ir.build import TargetStatus
from weightplan.planner.pipelines.plan import PlanData
from weightplan.planner.write.shards import ShardLayout


class Inversion(Enum):
    """How the outputs of a write plan were derived."""

    RECORD = "record"  # save: the exact inverse of the model's recorded load
    MAPPING = "mapping"  # save: the inverse of a mapping
    FORWARD = "forward"  # convert: the mapping applied as a load would
    REVERSE = "reverse"  # convert: the mapping's inverse

    @property
    def description(self) -> str:
        return {"record": "exact inverse of the recorded load",
                "mapping": "inverse of the mapping", "forward": "the mapping, forward",
                "reverse": "the mapping's inverse"}[self.value]


@dataclass(frozen=True, eq=False)
class WritePlanData(PlanData):
    """What will be written where, decided before a byte is written."""

    inversion: Inversion
    directory: str
    layout: ShardLayout
    overwrite: bool
    notes: tuple[Note, ...] = ()

    @property
    def model_bytes(self) -> int:
        """Bytes of tensor data written."""
        return self.layout.total_bytes

    @property
    def files(self) -> tuple[str, ...]:
        return self.layout.names

    @property
    def recorded_dtypes(self) -> tuple[str, ...] | None:
        """The floating dtypes a save through the load record writes (the checkpoint's,
        whatever the model was cast to), the one holding most bytes first; ``None`` for a
        save that writes the model's own dtypes."""
        if self.inversion is not Inversion.RECORD:
            return None
        held: dict[torch.dtype, int] = {}
        for c in self.conversions:
            for t in c.targets:
                dtype = t.dest.dtype
                if (t.status is TargetStatus.LOAD and dtype.is_floating_point
                        and dtype not in FP8_DTYPES):
                    held[dtype] = held.get(dtype, 0) + t.produced.numel * dtype.itemsize
        return tuple(str(d).removeprefix("torch.")
                     for d in sorted(held, key=lambda d: (-held[d], str(d))))

    @property
    def writes_fp8(self) -> bool:
        """Whether block FP8 tensors are written (kept FP8, or ``quantize="fp8"``)."""
        return any(t.dest.dtype in FP8_DTYPES for c in self.conversions for t in c.targets
                   if t.status is TargetStatus.LOAD)
