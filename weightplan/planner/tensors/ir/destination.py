"""Where a sink node's bytes go: a model tensor, a region of an output file, or memory;
and each output of a conversion, its :class:`Target` (what it must match, the dtype
written, its status) and the destination it lands in (:func:`destination`).

What an output must match is the model (loading) or the recorded checkpoint specs
(saving, :class:`OutputSpecs`); where it goes is the plan's :class:`SinkKind`. The
builder (:mod:`~weightplan.planner.tensors.ir.build`) makes one target per output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING

import torch

from weightplan.planner.core.geometry import row_major_strides
from weightplan.planner.core.makers import slot_setters
from weightplan.planner.core.quant.blocks import FP8_DTYPES
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor

if TYPE_CHECKING:  # (tensor parallelism's: imported where a plan shards)
    from weightplan.planner.core.sharding.placements import DestShard


class DestKind(Enum):
    ALLOCATE = "allocate"  # a new model tensor, resident after the load
    IN_PLACE = "in place"  # an existing model tensor's storage
    FILE = "file"  # a tensor in an output file: written, then released
    MEMORY = "memory"  # a new tensor returned to the caller (in-memory convert / revert)
    DISCARD = "discard"  # computed by a shared op but not kept (unexpected, tied, mismatched)

    __hash__ = object.__hash__  # (singletons: a C-level hash, as NodeKind's; one per step)


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


class TargetStatus(Enum):
    LOAD = "load"
    UNEXPECTED = "unexpected"  # no such model tensor
    MISMATCH = "mismatch"  # converted shape differs from the model's
    TIED_DUPLICATE = "tied"  # another name of the same tied tensor is loaded instead

    __hash__ = object.__hash__  # (singletons: a C-level hash, as NodeKind's; one per target)


class SinkKind(Enum):
    """Where a plan's outputs go: the direction's sink."""

    MODEL = "model"  # model tensors (allocated when on meta, else written in place)
    FILE = "file"  # tensors of output files
    MEMORY = "memory"  # fresh tensors handed back to the caller


@dataclass(frozen=True)
class OutputSpecs:
    """The specs outputs must have when there is no model: a recorded checkpoint's keys."""

    specs: Mapping[str, TensorSpec]


Expected = ModelInfo | OutputSpecs | None


@dataclass(frozen=True, slots=True, init=False)
class Target:
    """One output of a conversion and what happens to it. (Its slots are written through
    their descriptors, past the frozen ``__setattr__``: one target per key is made.)"""

    key: str
    produced: TensorSpec  # what the op chain yields
    position: tuple[int, int]  # (stream, index) in the final stage
    model: ModelTensor | None  # the model tensor it loads into (loading only)
    expected: TensorSpec | None  # the spec it must have (model's or recorded); None: any
    dtype: torch.dtype  # dtype written
    status: TargetStatus

    def __init__(self, key: str, produced: TensorSpec, position: tuple[int, int],
                 model: ModelTensor | None, expected: TensorSpec | None, dtype: torch.dtype,
                 status: TargetStatus) -> None:
        _target_key(self, key)
        _target_produced(self, produced)
        _target_position(self, position)
        _target_model(self, model)
        _target_expected(self, expected)
        _target_dtype(self, dtype)
        _target_status(self, status)

    @property
    def dest(self) -> TensorSpec:
        """What is written: the produced spec in the written dtype (``produced`` itself
        when that is its dtype: one object per target, not one per ask)."""
        produced = self.produced
        return produced if produced.dtype == self.dtype else TensorSpec(produced.shape,
                                                                          self.dtype)


(_target_key, _target_produced, _target_position, _target_model, _target_expected,
 _target_dtype, _target_status) = slot_setters(Target, [f.name for f in fields(Target)])


def destination(t: Target, sink: SinkKind) -> Destination:
    """Where target ``t`` lands: nowhere unless it loads; else the direction's sink."""
    if t.status is not TargetStatus.LOAD:
        return Destination(t.key, (t.key,), t.produced, DestKind.DISCARD,
                           row_major_strides(t.produced.shape))
    if sink is SinkKind.FILE or sink is SinkKind.MEMORY or t.model is None:
        dest = t.dest
        kind = DestKind.FILE if sink is SinkKind.FILE else DestKind.MEMORY
        return Destination(t.key, (t.key,), dest, kind, row_major_strides(dest.shape))
    kind = DestKind.ALLOCATE if t.model.allocates else DestKind.IN_PLACE
    return Destination(t.key, t.model.aliases, t.dest, kind, t.model.stride)


def expected_spec(expected: Expected, key: str) -> TensorSpec | None:
    """The spec output ``key`` must have (``None``: no such tensor, or anything goes)."""
    if isinstance(expected, ModelInfo):
        mt = expected.get(key)
        return mt.spec if mt is not None else None
    if isinstance(expected, OutputSpecs):
        return expected.specs.get(key)
    return None


def make_target(key: str, spec: TensorSpec, position: tuple[int, int], expected: Expected,
                dtype: torch.dtype | None) -> Target:
    """The target of output ``key`` of spec ``spec`` (the model tensor looked up once)."""
    if expected is None:  # (nothing to match: it loads, as produced or in ``dtype``)
        return Target(key, spec, position, None, None, destination_dtype(spec, None, dtype),
                      TargetStatus.LOAD)
    mt = expected.get(key) if isinstance(expected, ModelInfo) else None
    want = (mt.spec if mt is not None else None) if isinstance(expected, ModelInfo) \
        else expected_spec(expected, key)
    if expected is not None and want is None:
        return Target(key, spec, position, None, None, spec.dtype, TargetStatus.UNEXPECTED)
    status = TargetStatus.LOAD
    if want is not None and tuple(want.shape) != tuple(spec.shape):
        status = TargetStatus.MISMATCH
    if isinstance(expected, OutputSpecs) and want is not None:
        written = want.dtype  # a recorded checkpoint's dtype is written back as it was
    else:
        written = destination_dtype(spec, mt, dtype)
    return Target(key, spec, position, mt, want, written, status)


def destination_dtype(produced: TensorSpec, mt: ModelTensor | None,
                      requested: torch.dtype | None) -> torch.dtype:
    """Allocated tensors keep their dtype; new ones take ``requested`` (floats) or the model's."""
    if mt is None and requested is None:  # (nothing asked of it: as produced)
        return produced.dtype
    floating = produced.dtype.is_floating_point and produced.dtype not in FP8_DTYPES
    if mt is not None and mt.spec.dtype in FP8_DTYPES:
        return mt.spec.dtype  # FP8 parameters keep FP8 (a requested dtype is for floats)
    if mt is None:
        return requested if requested is not None and floating else produced.dtype
    if not mt.on_meta or requested is None or mt.keep_dtype or not mt.spec.dtype.is_floating_point:
        return mt.spec.dtype
    return requested if floating else mt.spec.dtype
