"""Where a sink node's bytes go: a model tensor, a region of an output file, or memory."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING

from weightplan.planner.core.makers import slot_setters
from weightplan.planner.core.spec import TensorSpec

if TYPE_CHECKING:  # (tensor parallelism's: imported where a plan shards)
    from weightplan.planner.core.sharding.placements import DestShard


class DestKind(Enum):
    ALLOCATE = "allocate"  # a new model tensor, resident after the load
    IN_PLACE = "in place"  # an existing model tensor's storage
    FILE = "file"  # a tensor in an output file: written, then released
    MEMORY = "memory"  # a new tensor returned to the caller (in-memory convert / revert)
    DISCARD = "discard"  # computed by a shared op but not kept (unexpected, tied, mismatched)


ALLOCATED = frozenset((DestKind.ALLOCATE, DestKind.MEMORY))  # allocated, then resident


@dataclass(frozen=True, slots=True, init=False)
class Destination:
    """A tensor the executor writes (or, for ``DISCARD``, a value nothing keeps). (Its
    slots are written through their descriptors, past the frozen ``__setattr__``: one
    destination per key is made.)"""

    key: str
    aliases: tuple[str, ...]
    spec: TensorSpec
    kind: DestKind
    stride: tuple[int, ...]
    staged: bool = False  # FILE: assembled in memory, then written in one piece
    shard: DestShard | None = None  # tensor parallel: this rank's part of a parameter

    def __init__(self, key: str, aliases: tuple[str, ...], spec: TensorSpec, kind: DestKind,
                 stride: tuple[int, ...], staged: bool = False, shard: DestShard | None = None
                 ) -> None:
        _set_key(self, key)
        _set_aliases(self, aliases)
        _set_spec(self, spec)
        _set_kind(self, kind)
        _set_stride(self, stride)
        _set_staged(self, staged)
        _set_shard(self, shard)

    @property
    def allocates(self) -> bool:
        """The executor allocates this tensor and it stays resident (model or memory)."""
        return self.kind in ALLOCATED

    @property
    def written(self) -> bool:
        return self.kind is not DestKind.DISCARD


_set_key, _set_aliases, _set_spec, _set_kind, _set_stride, _set_staged, _set_shard = \
    slot_setters(Destination, [f.name for f in fields(Destination)])
