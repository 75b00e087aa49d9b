"""Output checkpoint layout: which tensor goes in which shard, at which byte offset.

Everything is decided before a byte is written, from specs alone: the safetensors header
of every shard (JSON padded to 8 bytes, tensors packed back to back in key order), the
absolute data offset of every tensor, and the ``model.safetensors.index.json`` that names
the shards. The writer then puts each tensor's bytes at its offset, in any order.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from weightplan.errors import SaveError
from weightplan.planner.core.spec import TORCH_TO_SAFETENSORS, TensorSpec

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class ShardFile:
    """One output file: its name, header bytes, total size and tensors."""

    name: str
    keys: tuple[str, ...]
    header: bytes  # 8-byte length + padded JSON
    size: int


@dataclass(frozen=True)
class ShardLayout:
    """Every output file and where each tensor's bytes go."""

    files: tuple[ShardFile, ...]
    locations: Mapping[str, tuple[str, int]]  # key -> (file name, absolute data offset)
    index: bytes | None  # the index JSON when there are several shards
    total_bytes: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files) + ((INDEX_NAME,) if self.index else ())


def plan_layout(tensors: Sequence[tuple[str, TensorSpec]], max_shard_size: int,
                metadata: Mapping[str, str] | None = None, *,
                single_name: str = SINGLE_NAME) -> ShardLayout:
    """Pack ``tensors`` (in the given order) into shards of at most ``max_shard_size`` bytes
    (a tensor larger than that gets a shard of its own)."""
    groups: list[list[tuple[str, TensorSpec]]] = [[]]
    size = 0
    for key, spec in tensors:
        if groups[-1] and size + spec.nbytes > max_shard_size:
            groups.append([])
            size = 0
        groups[-1].append((key, spec))
        size += spec.nbytes
    meta = dict(metadata or {"format": "pt"})
    n = len(groups)
    files, locations = [], {}
    for i, group in enumerate(groups):
        name = single_name if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        header, offsets = encode_header(group, meta)
        files.append(ShardFile(name, tuple(k for k, _ in group), header,
                               len(header) + sum(s.nbytes for _, s in group)))
        locations.update({k: (name, off) for k, off in offsets.items()})
    total = sum(s.nbytes for _, s in tensors)
    index = None
    if n > 1:
        weight_map = {k: f.name for f in files for k in f.keys}
        index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                           indent=2, sort_keys=True).encode() + b"\n"
    return ShardLayout(tuple(files), locations, index, total)


def encode_header(tensors: Sequence[tuple[str, TensorSpec]], metadata: Mapping[str, str]
                  ) -> tuple[bytes, dict[str, int]]:
    """The safetensors header for ``tensors`` packed in order; absolute data offsets."""
    body: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for key, spec in tensors:
        if spec.dtype not in TORCH_TO_SAFETENSORS:
            raise SaveError(f"{key}: dtype {spec.dtype} has no safetensors name")
        body[key] = {"dtype": TORCH_TO_SAFETENSORS[spec.dtype], "shape": list(spec.shape),
                     "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(body, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    absolute, offset = {}, 0
    for key, spec in tensors:
        absolute[key] = start + offset
        offset += spec.nbytes
    return struct.pack("<Q", len(raw)) + raw, absolute
