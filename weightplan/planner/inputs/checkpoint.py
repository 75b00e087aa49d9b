"""Checkpoint sources, read from headers only.

A checkpoint is a ``.safetensors`` file, a directory (one file, or shards named by a
``*.safetensors.index.json``), a list of files, or an in-memory ``{key: tensor}`` dict.
:func:`open_checkpoint` parses and validates every header (8-byte little-endian length,
JSON, data offsets) without touching tensor bytes, so bad input fails here, before any
parameter is touched. Pickle-based formats are refused: they can execute code.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from weightplan.errors import (
    CheckpointError, HeaderError, MissingShardError, NotSafetensorsError,
    TruncatedCheckpointError, UnsafeFormatError,
)
from weightplan.planner.tensors.spec import SAFETENSORS_DTYPES, TensorSpec

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One checkpoint tensor: where its bytes are and what they hold."""

    key: str
    spec: TensorSpec
    file: str | None  # None: the tensor lives in an in-memory dict
    offset: int = 0  # absolute byte offset of the first data byte in ``file``
    contiguous: bool = True  # in-memory tensors may be strided; file data never is

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes


@dataclass(frozen=True, slots=True)
class FileStamp:
    """Identity of a file at plan time, checked again before execution."""

    path: str
    size: int
    mtime_ns: int
    data_start: int = 0  # first byte of the data section (after the 8-byte length and header)

    @classmethod
    def of(cls, path: str, data_start: int = 0) -> "FileStamp":
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns, data_start)


@dataclass(frozen=True)
class Checkpoint:
    """All tensor entries of a checkpoint, by key, plus where they came from."""

    entries: Mapping[str, TensorEntry]
    files: tuple[FileStamp, ...] = ()
    tensors: Mapping[str, torch.Tensor] | None = field(default=None, compare=False)
    metadata: Mapping[str, str] = field(default_factory=dict)
    description: str = "<memory>"

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)


def open_checkpoint(source: object) -> Checkpoint:
    """Read the headers of ``source`` (path, directory, list of paths, or dict).

    Raises:
        CheckpointError: a subclass naming the file (and key) when anything is wrong.
    """
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, Mapping):
        return _from_memory(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return _from_files(_directory_files(path), description=str(path))
        return _from_files([(str(path), None)], description=str(path))
    if isinstance(source, Sequence):
        files: list[tuple[str, Mapping[str, str] | None]] = [(str(Path(p)), None) for p in source]
        if not files:
            raise CheckpointError("an empty list of checkpoint files was given")
        return _from_files(files, description=f"{len(files)} files")
    raise CheckpointError(
        f"unsupported checkpoint {type(source).__name__}: pass a .safetensors path, a "
        "directory, a list of paths or a {key: tensor} dict")


def _from_memory(tensors: Mapping) -> Checkpoint:
    entries = {}
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise HeaderError(f"value is a {type(value).__name__}, not a tensor",
                              file="<memory>", key=str(key))
        entries[str(key)] = TensorEntry(str(key), TensorSpec.of(value), None,
                                        contiguous=value.is_contiguous())
    return Checkpoint(entries, tensors=dict(tensors), description="<memory>")


def _directory_files(path: Path) -> list[tuple[str, Mapping[str, str] | None]]:
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise HeaderError(f"several index files: {[i.name for i in indexes]}", file=str(path))
    if indexes:
        return _index_files(indexes[0])
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return [(str(s), None) for s in shards]
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise UnsafeFormatError(
            f"only pickle-based checkpoints found ({', '.join(pickles)}); weightplan never "
            "unpickles untrusted data. Convert them to safetensors first.", file=str(path))
    raise CheckpointError("no .safetensors file in this directory", file=str(path))


def _index_files(index: Path) -> list[tuple[str, Mapping[str, str] | None]]:
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HeaderError(f"unreadable index: {e}", file=str(index)) from e
    by_file: dict[str, dict[str, str]] = {}
    for key, name in weight_map.items():
        by_file.setdefault(str(name), {})[key] = name
    files: list[tuple[str, Mapping[str, str] | None]] = []
    for name, keys in sorted(by_file.items()):
        shard = index.parent / name
        if not shard.is_file():
            raise MissingShardError(
                f"the index names shard {name!r} (holding {next(iter(keys))!r} and "
                f"{len(keys) - 1} more keys) but it does not exist", file=str(index))
        files.append((str(shard), keys))
    return files


def _from_files(files: list[tuple[str, Mapping[str, str] | None]], *, description: str
                ) -> Checkpoint:
    entries: dict[str, TensorEntry] = {}
    stamps = []
    metadata: dict[str, str] = {}
    for path, expected_keys in files:
        file_entries, file_meta, data_start = read_header(path)
        for key in expected_keys or ():
            if key not in file_entries:
                raise HeaderError("the index places this key here but the file's header "
                                  "lacks it", file=path, key=key)
        for key, entry in file_entries.items():
            if key in entries:
                raise HeaderError(f"key also present in {entries[key].file}", file=path, key=key)
            entries[key] = entry
        metadata.update(file_meta)
        stamps.append(FileStamp.of(path, data_start))
    return Checkpoint(entries, tuple(stamps), metadata=metadata, description=description)


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str], int]:
    """Parse and validate one safetensors header; returns entries, ``__metadata__`` and
    the first byte of the data section."""
    if Path(path).suffix in PICKLE_SUFFIXES:
        raise UnsafeFormatError("pickle-based checkpoint; weightplan never unpickles "
                                "untrusted data. Convert it to safetensors first.", file=path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            _check_magic(path, head, size)
            (n,) = struct.unpack("<Q", head)
            raw = f.read(n)
    except CheckpointError:
        raise
    except FileNotFoundError as e:
        raise CheckpointError("file not found", file=path) from e
    except IsADirectoryError as e:
        raise CheckpointError("is a directory, not a file", file=path) from e
    except OSError as e:
        raise CheckpointError(f"can't read: {e}", file=path) from e
    header = _parse_json(path, raw)
    data_start = 8 + n
    file_meta = header.pop("__metadata__", None) or {}
    if not isinstance(file_meta, dict):
        raise HeaderError("__metadata__ is not an object", file=path)
    entries = {key: _entry(path, key, info, data_start, size) for key, info in header.items()}
    return entries, {str(k): str(v) for k, v in file_meta.items()}, data_start


def _check_magic(path: str, head: bytes, size: int) -> None:
    if len(head) < 8:
        raise NotSafetensorsError(f"only {size} bytes; a safetensors file starts with an "
                                  "8-byte header length", file=path)
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES or n + 8 > size:
        if head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05"):
            raise UnsafeFormatError("this is a pickle/zip (torch.save) file, not safetensors; "
                                    "weightplan never unpickles untrusted data", file=path)
        if n <= MAX_HEADER_BYTES and size > 8:
            raise TruncatedCheckpointError(
                f"header claims {n} bytes but the file has {size - 8} after the length",
                file=path)
        raise NotSafetensorsError(f"header length {n} is implausible for a {size}-byte file",
                                  file=path)


def _parse_json(path: str, raw: bytes) -> dict:
    if not raw.lstrip()[:1] == b"{":
        raise NotSafetensorsError("header is not a JSON object", file=path)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise HeaderError(f"header is not valid JSON: {e}", file=path) from e
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object", file=path)
    return header


def _entry(path: str, key: str, info: object, data_start: int, size: int) -> TensorEntry:
    if not isinstance(info, dict):
        raise HeaderError("entry is not an object", file=path, key=key)
    dtype_name, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype_name not in SAFETENSORS_DTYPES:
        raise HeaderError(f"unknown dtype {dtype_name!r}", file=path, key=key)
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise HeaderError(f"invalid shape {shape!r}", file=path, key=key)
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise HeaderError(f"invalid data_offsets {offsets!r}", file=path, key=key)
    spec = TensorSpec(tuple(shape), SAFETENSORS_DTYPES[dtype_name])
    begin, end = offsets
    if end - begin != spec.nbytes:
        raise HeaderError(f"data_offsets span {end - begin} bytes but {dtype_name}{shape} "
                          f"needs {spec.nbytes}", file=path, key=key)
    if data_start + end > size:
        raise TruncatedCheckpointError(
            f"data ends at byte {data_start + end} but the file has {size} bytes", file=path,
            key=key)
    return TensorEntry(key, spec, path, data_start + begin)
