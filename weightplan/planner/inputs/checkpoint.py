"""Checkpoint sources, read from headers only.

A checkpoint is a ``.safetensors`` file, a directory (one file, or shards named by a
``*.safetensors.index.json``), a list of files, or an in-memory ``{key: tensor}`` dict.
:func:`open_checkpoint` parses and validates every header (8-byte little-endian length,
JSON, data offsets) without touching tensor bytes, so bad input fails here, before any
parameter is touched. Pickle-based formats are refused: they can execute code.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from operator import attrgetter
from pathlib import Path

import torch

from weightplan.errors import (
    ArgumentError, CheckpointError, HeaderError, NotSafetensorsError, TruncatedCheckpointError,
    UnsafeFormatError,
)
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.inputs.fingerprint import FileStamp, stamp_fd
from weightplan.planner.inputs.header_bulk import SpecCache, fast_columns, fast_entries
from weightplan.planner.inputs.paths import (
    check_path_argument, open_regular, pread_exactly, refuse_interrupted_save,
)
from weightplan.planner.inputs.safetensors_format import (
    MAX_HEADER_BYTES, check_coverage, check_offsets, check_shape, parse_header,
    parse_metadata,
)
from weightplan.planner.inputs.shard_index import IndexShard, index_files
from weightplan.planner.core.spec import SAFETENSORS_DTYPES, TensorSpec

__all__ = ["Checkpoint", "FileStamp", "TensorEntry", "open_checkpoint", "read_header"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_SPEC = attrgetter("spec")


@dataclass(frozen=True)
class Checkpoint:
    """All tensor entries of a checkpoint, by key, plus where they came from."""

    entries: Mapping[str, TensorEntry]
    files: tuple[FileStamp, ...] = ()
    tensors: Mapping[str, torch.Tensor] | None = field(default=None, compare=False)
    metadata: Mapping[str, str] = field(default_factory=dict)
    description: str = "<memory>"

    @cached_property
    def nbytes(self) -> int:
        """Bytes of all entries: each distinct spec's size times its count (entries of one
        header share their spec objects, so 92k keys are a few dozen multiplications)."""
        specs = list(map(_SPEC, self.entries.values()))
        by_id = dict(zip(map(id, specs), specs, strict=True))
        return sum(by_id[i].nbytes * n for i, n in Counter(map(id, specs)).items())

    def __len__(self) -> int:
        return len(self.entries)


@paused_gc
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
        path = Path(check_path_argument(source))
        if _is_dir(path):
            refuse_interrupted_save(path)
            return _from_files(_directory_files(path), description=str(path))
        refuse_interrupted_save(path.parent)
        return _from_files([(str(path), None)], description=str(path))
    if isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        files: list[tuple[str, IndexShard | None]] = [
            (check_path_argument(p, what="checkpoint file"), None) for p in source]
        if not files:
            raise CheckpointError("an empty list of checkpoint files was given")
        for p, _ in files:
            refuse_interrupted_save(Path(p).parent)
        return _from_files(files, description=f"{len(files)} files")
    if isinstance(source, (bytes, bytearray, memoryview)):
        check_path_argument(source)
    raise ArgumentError(
        f"unsupported checkpoint {type(source).__name__}: pass a .safetensors path, a "
        "directory, a list of paths or a {key: tensor} dict")


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError) as e:
        raise CheckpointError(f"can't use this path: {e}", file=str(path)) from e


def _from_memory(tensors: Mapping) -> Checkpoint:
    entries = {}
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise HeaderError(f"value is a {type(value).__name__}, not a tensor",
                              file="<memory>", key=str(key))
        entries[str(key)] = TensorEntry(str(key), TensorSpec.of(value), None,
                                        contiguous=value.is_contiguous())
    return Checkpoint(entries, tensors=dict(tensors), description="<memory>")


def _directory_files(path: Path) -> list[tuple[str, IndexShard | None]]:
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise HeaderError(f"several index files: {[i.name for i in indexes]}", file=str(path))
    if indexes:
        return index_files(indexes[0])
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return [(str(s), None) for s in shards]
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise UnsafeFormatError(
            f"only pickle-based checkpoints found ({', '.join(pickles)}); weightplan never "
            "unpickles untrusted data. Convert them to safetensors first.", file=str(path))
    raise CheckpointError("no .safetensors file in this directory", file=str(path))


def _from_files(files: list[tuple[str, IndexShard | None]], *, description: str
                ) -> Checkpoint:
    """Every file's header read as columns, then one dict of them all, then the index's
    placements checked (each pass over all files at once keeps its data in cache). Any
    error, or anything that doesn't add up (a key twice, a key the index places in a file
    that lacks it), is left to :func:`_from_files_exact`, which raises the precise error
    of the first file at fault."""
    stamps = []
    metadata: dict[str, str] = {}
    specs: SpecCache = {}  # the files share one spec per (dtype, shape)
    keys: list[list[str]] = []
    made: list[list[TensorEntry]] = []
    try:
        for path, _ in files:
            file_keys, file_entries, file_meta, stamp = _read_columns(path, specs)
            keys.append(file_keys)
            made.append(file_entries)
            metadata.update(file_meta)
            stamps.append(stamp)
    except CheckpointError:
        return _from_files_exact(files, description=description)
    entries = dict(zip(chain.from_iterable(keys), chain.from_iterable(made), strict=True))
    # no key twice, in a file or across them, and no "__metadata__" entry (a fast
    # reading's keys may hold one: the strict path refuses it); each file's keys distinct,
    # the index's count of them proves it placed none elsewhere
    shards = [shard for _, shard in files]
    if (len(entries) != sum(map(len, keys)) or "__metadata__" in entries
            or not all(s is None or s.holds(k) for s, k in zip(shards, keys, strict=True))):
        return _from_files_exact(files, description=description)
    return Checkpoint(entries, tuple(stamps), metadata=metadata, description=description)


def _from_files_exact(files: list[tuple[str, IndexShard | None]], *, description: str
                      ) -> Checkpoint:
    """:func:`_from_files` file by file, each header a dict checked in turn: the reference,
    which raises the precise error."""
    entries: dict[str, TensorEntry] = {}
    stamps = []
    metadata: dict[str, str] = {}
    specs: SpecCache = {}  # the files share one spec per (dtype, shape)
    read: list[dict[str, TensorEntry]] = []
    for path, shard in files:
        file_entries, file_meta, stamp = read_stamped_header(path, specs)
        if shard is not None:
            shard.check(path, file_entries)
        before = len(entries)
        entries.update(file_entries)
        if len(entries) != before + len(file_entries):  # a key of an earlier file
            key, where = next((k, e) for k in file_entries for e in read if k in e)
            raise HeaderError(f"key also present in {where[key].file}", file=path, key=key)
        read.append(file_entries)
        metadata.update(file_meta)
        stamps.append(stamp)
    return Checkpoint(entries, tuple(stamps), metadata=metadata, description=description)


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Parse and validate one safetensors header; returns entries and ``__metadata__``."""
    entries, meta, _ = read_stamped_header(path)
    return entries, meta


def read_stamped_header(path: str, specs: SpecCache | None = None
                        ) -> tuple[dict[str, TensorEntry], dict[str, str], FileStamp]:
    """:func:`read_header` plus the file's :class:`FileStamp` (taken on the same open file
    and the same header bytes). ``specs``: a cache of specs shared across files."""
    raw, data_start, size, stamp = _read_raw(path)
    parsed = fast_entries(path, raw, data_start, size, {} if specs is None else specs)
    if parsed is None:  # anything unusual: entry by entry, which raises the precise error
        parsed = strict_entries(path, raw, data_start, size)
    return parsed[0], parsed[1], stamp


def _read_columns(path: str, specs: SpecCache
                  ) -> tuple[list[str], list[TensorEntry], dict[str, str], FileStamp]:
    """:func:`read_stamped_header` as columns: its keys may repeat, or hold
    ``"__metadata__"``, which the caller must refuse (by the strict path)."""
    raw, data_start, size, stamp = _read_raw(path)
    columns = fast_columns(path, raw, data_start, size, specs)
    if columns is None:
        entries, meta = strict_entries(path, raw, data_start, size)
        columns = list(entries), list(entries.values()), meta
    return *columns, stamp


def _read_raw(path: str) -> tuple[bytes, int, int, FileStamp]:
    """The header bytes of the safetensors file ``path``, where its data starts, its size
    and its stamp."""
    if Path(path).suffix in PICKLE_SUFFIXES:
        raise UnsafeFormatError("pickle-based checkpoint; weightplan never unpickles "
                                "untrusted data. Convert it to safetensors first.", file=path)
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        _check_magic(path, head, size)
        (n,) = struct.unpack("<Q", head)
        raw = pread_exactly(fd, n, 8, path)
        stamp = stamp_fd(path, fd, (head, raw))
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"can't read: {e}", file=path) from e
    finally:
        os.close(fd)
    return raw, 8 + n, size, stamp


def strict_entries(path: str, raw: bytes, data_start: int, size: int
                   ) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """The header ``raw`` read entry by entry, every rule checked in turn: the reference
    that :func:`~weightplan.planner.inputs.header_bulk.fast_entries` must agree with."""
    header = parse_header(path, raw)
    file_meta = parse_metadata(path, header.pop("__metadata__", None))
    entries = parse_entries(path, header, data_start, size)
    # every entry spans its data_offsets exactly (parse_entries checked end - begin)
    check_coverage(path, {k: (e.offset - data_start, header[k]["data_offsets"][1])
                          for k, e in entries.items()}, size - data_start)
    return entries, file_meta


def parse_entries(path: str, header: dict, data_start: int, size: int
                  ) -> dict[str, TensorEntry]:
    """Every header entry as a :class:`TensorEntry`, validated like :func:`_entry`.

    The fast path for headers of ~100k keys: one ``TensorSpec`` per distinct
    (dtype, shape), validated once; anything unusual goes through :func:`_entry`,
    which raises the precise error.
    """
    specs: dict[tuple, tuple[TensorSpec, int]] = {}
    entries: dict[str, TensorEntry] = {}
    for key, info in header.items():
        try:
            dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ident = (dtype_name, *shape)
            # 0 == False == 0.0 as dict keys: a cached spec is only for dims that are ints
            known = specs.get(ident) if all(type(d) is int for d in shape) else None
            if known is None:
                spec = _spec(dtype_name, shape)
                known = specs[ident] = (spec, spec.nbytes)
            spec, nbytes = known
            ok = (type(begin) is int and type(end) is int and 0 <= begin
                  and end - begin == nbytes and data_start + end <= size)
        except (TypeError, KeyError, ValueError):
            ok = False
        entries[key] = (TensorEntry(key, spec, path, data_start + begin) if ok
                        else _entry(path, key, info, data_start, size))
    return entries


_FAST_DIM = 1 << 31  # larger dims take _entry's exact checks (u64 range, 63-bit products)


def _spec(dtype_name: object, shape: list) -> TensorSpec:
    """The spec of a valid (dtype, shape), else ``ValueError`` (the caller re-checks)."""
    if dtype_name not in SAFETENSORS_DTYPES or not isinstance(shape, list) or not all(
            type(d) is int and 0 <= d < _FAST_DIM for d in shape):
        raise ValueError(dtype_name, shape)
    return TensorSpec(tuple(shape), SAFETENSORS_DTYPES[dtype_name])


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


def _entry(path: str, key: str, info: object, data_start: int, size: int) -> TensorEntry:
    if not isinstance(info, dict):
        raise HeaderError("entry is not an object", file=path, key=key)
    for field_name in ("dtype", "shape", "data_offsets"):
        if field_name not in info:
            raise HeaderError(f"entry lacks {field_name!r}", file=path, key=key)
    dtype_name = info["dtype"]
    if not isinstance(dtype_name, str) or dtype_name not in SAFETENSORS_DTYPES:
        raise HeaderError(f"unknown dtype {dtype_name!r}", file=path, key=key)
    shape = check_shape(path, key, info["shape"])
    begin, end = check_offsets(path, key, info["data_offsets"])
    spec = TensorSpec(shape, SAFETENSORS_DTYPES[dtype_name])
    if end - begin != spec.nbytes:
        raise HeaderError(f"data_offsets span {end - begin} bytes but {dtype_name}{list(shape)} "
                          f"needs {spec.nbytes}", file=path, key=key)
    if data_start + end > size:
        raise TruncatedCheckpointError(
            f"data ends at byte {data_start + end} but the file has {size} bytes", file=path,
            key=key)
    return TensorEntry(key, spec, path, data_start + begin)
