"""Hand-built inputs for the planner core's unit tests: entries at chosen byte offsets of
a pretend file, groups without routing, and conversions built from them."""

from __future__ import annotations

import torch

from weightplan import WeightConverter
from weightplan.planner.inputs.checkpoint import Checkpoint, FileStamp, TensorEntry
from weightplan.planner.keys.routing import Group, Route
from weightplan.planner.tensors.ir.build import Conversion, SinkKind, build_conversion
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.core.spec import TensorSpec

FILE = "/pretend/model.safetensors"
DATA_START = 64


def entry(key: str, shape: tuple[int, ...], offset: int, dtype: torch.dtype = torch.float32
          ) -> TensorEntry:
    return TensorEntry(key, TensorSpec(shape, dtype), FILE, DATA_START + offset)


def checkpoint(*entries: TensorEntry) -> Checkpoint:
    end = max(e.offset + e.nbytes for e in entries)
    return Checkpoint({e.key: e for e in entries}, (FileStamp(FILE, end, 0, data_start=DATA_START),))


def conversion(streams: list[list[TensorEntry]], targets: list[str],
               ops: list[ConversionOp] | None = None) -> Conversion:
    """``streams`` of entries through ``ops`` into ``targets``, landing in fresh tensors."""
    routes = tuple(tuple(Route(e.key, e.key, ()) for e in s) for s in streams)
    converter = None
    if ops:
        sources = [s[0].key.replace(".0.", ".*.") for s in streams]
        converter = WeightConverter(sources, targets, ops)
    group = Group(converter, tuple(tuple(s) for s in streams), routes, tuple(targets))
    return build_conversion(group, None, None, SinkKind.MEMORY)
