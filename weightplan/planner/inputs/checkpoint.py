"""Checkpoint sources, read from headers only.

A checkpoint is a ``.safetensors`` file, a directory (``model.safetensors``, else the shards
a ``*.safetensors.index.json`` names, as transformers picks), a list of files, or an
in-memory ``{key: tensor}`` dict.
:func:`open_checkpoint` parses and validates every header (8-byte little-endian length,
JSON, data offsets) without touching tensor bytes, so bad input fails here, before any
parameter is touched. Pickle-based formats are refused: they can execute code.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from pathlib import Path

import torch

from weightplan.errors import (
    ArgumentError, CheckpointError, HeaderError, NotSafetensorsError, TruncatedCheckpointError,
    UnsafeFormatError,
)
from weightplan.planner.core.paused_gc import paused_gc
from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.problems import Note
from weightplan.planner.inputs.fingerprint import FileStamp, stamp_fd
from weightplan.planner.inputs.paths import (
    check_path_argument, open_regular, pread_exactly, refuse_interrupted_save,
)
from weightplan.planner.inputs.safetensors_format import (
    MAX_HEADER_BYTES, SpecCache, header_columns,
)
from weightplan.planner.inputs.shard_index import IndexShard, index_files
from weightplan.planner.inputs.variants import (
    check_variant, missing_variant, refuse_variants, variant_index, variant_of, variant_single,
)
from weightplan.planner.core.spec import TensorSpec

__all__ = ["Checkpoint", "DirectoryRead", "FileStamp", "TensorEntry", "directory_files",
           "open_checkpoint", "open_directory", "read_header", "variant_read"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SINGLE_FILE = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME


@dataclass(frozen=True)
class Checkpoint:
    """All tensor entries of a checkpoint, by key, plus where they came from."""

    entries: Mapping[str, TensorEntry]
    files: tuple[FileStamp, ...] = ()
    tensors: Mapping[str, torch.Tensor] | None = field(default=None, compare=False)
    metadata: Mapping[str, str] = field(default_factory=dict)
    description: str = "<memory>"
    # ``.safetensors`` files of the checkpoint's directory it doesn't read (a shard its
    # index doesn't name, shards beside a ``model.safetensors``): (name, why), noted
    left_out: tuple[tuple[str, str], ...] = ()

    @cached_property
    def nbytes(self) -> int:
        """Bytes of all entries."""
        return sum(entry.nbytes for entry in self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def left_out_notes(self) -> tuple[Note, ...]:
        """A note per file of :attr:`left_out` (transformers skips them without a word)."""
        return tuple(Note(name, f"{name} is in {self.description} but not read: {why}")
                     for name, why in self.left_out)


@dataclass(frozen=True, eq=False)
class DirectoryRead:
    """A checkpoint (a directory, or a ``.safetensors`` file in one) with what its caller
    has read of it, handed down as the checkpoint so that one call reads nothing twice
    (``from_pretrained``: ``config.json`` to build the model; the headers, when its dtype
    came from them)."""

    path: Path  # the checkpoint as given
    config: Mapping[str, object] | None  # its directory's config.json as read (``None``: none)
    variant: str | None = None  # the weight variant read (``model.fp16.safetensors``)

    @cached_property
    def directory(self) -> Path:
        """Where its ``config.json`` (and any other config) is: the checkpoint's directory."""
        return self.path if _is_dir(self.path) else self.path.parent

    @cached_property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint's headers, read at the first use (a variant's: a directory's)."""
        if self.variant is not None:
            return open_directory(self.path, self.variant)
        return open_checkpoint(self.path)


def variant_read(checkpoint: object, variant: object) -> DirectoryRead:
    """``checkpoint`` (a directory, or what was read of one) to be read for ``variant``'s
    files (``None``: no variant), as transformers' ``from_pretrained(variant=...)`` reads it.

    Raises:
        ArgumentError: a ``variant`` that is no word of a file name, one given for anything
            but a directory, or a second variant for what was read for one.
    """
    variant = check_variant(variant)
    if isinstance(checkpoint, DirectoryRead):
        if checkpoint.variant not in (None, variant):
            raise ArgumentError(f"variant={variant!r}: this checkpoint is read for the variant "
                                f"{checkpoint.variant!r} already; pass one variant")
        return DirectoryRead(checkpoint.path, checkpoint.config, variant or checkpoint.variant)
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ArgumentError(f"variant={variant!r} picks a variant's files in a checkpoint "
                            f"directory, and the checkpoint is a {type(checkpoint).__name__}: "
                            "give the directory, or drop the variant")
    path = Path(check_path_argument(checkpoint))
    if variant is not None and not _is_dir(path):
        raise ArgumentError(f"variant={variant!r} picks a variant's files in a directory: "
                            f"{path} is a file; give its directory, or drop the variant")
    return DirectoryRead(path, None, variant)


@paused_gc
def open_checkpoint(source: object) -> Checkpoint:
    """Read the headers of ``source`` (path, directory, list of paths, or dict; a
    :class:`DirectoryRead`: its headers, read once).

    Raises:
        CheckpointError: a subclass naming the file (and key) when anything is wrong.
    """
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, DirectoryRead):
        return source.checkpoint
    if isinstance(source, Mapping):
        return _from_memory(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(check_path_argument(source))
        if _is_dir(path):
            return open_directory(path)
        refuse_interrupted_save(path.parent)
        return _from_files([(str(path), None)], description=str(path))
    if isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        files: list[tuple[str, IndexShard | None]] = [
            (check_path_argument(p, what="checkpoint file"), None) for p in source]
        if not files:
            raise CheckpointError("an empty list of checkpoint files was given")
        for p, _ in files:
            refuse_interrupted_save(Path(p).parent)
        more = f" + {len(files) - 1} more" if len(files) > 1 else ""
        return _from_files(files, description=f"{files[0][0]}{more}")
    if isinstance(source, (bytes, bytearray, memoryview)):
        check_path_argument(source)
    raise ArgumentError(
        f"unsupported checkpoint {type(source).__name__}: pass a .safetensors path, a "
        "directory, a list of paths or a {key: tensor} dict")


def open_directory(path: Path, variant: str | None = None) -> Checkpoint:
    """The headers of a checkpoint directory's files (:func:`directory_files`)."""
    refuse_interrupted_save(path)
    found = directory_files(path, variant)
    return _from_files(found, description=str(path), left_out=_left_out(path, found, variant))


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


def directory_files(path: Path, variant: str | None = None
                    ) -> list[tuple[str, IndexShard | None]]:
    """The files a directory's checkpoint is: ``model.safetensors`` where there is one (as
    transformers' ``from_pretrained`` picks it before an index beside it), else the shards
    its index names, else every ``.safetensors`` file (unless some are a variant's;
    ``variant``: that variant's one file, else its index's shards, as transformers picks
    them: :mod:`~weightplan.planner.inputs.variants`).

    Raises:
        CheckpointError: nothing to read, the variant asked for is not there, or several
            variants and none asked for (the message names them).
    """
    if variant is not None:
        return _variant_files(path, variant)
    single = path / SINGLE_FILE
    if single.is_file():
        return [(str(single), None)]
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise HeaderError(f"several index files: {[i.name for i in indexes]}", file=str(path))
    if indexes:
        return index_files(indexes[0])
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        refuse_variants(path, [s.name for s in shards])
        return [(str(s), None) for s in shards]
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise UnsafeFormatError(
            f"only pickle-based checkpoints found ({', '.join(pickles)}); weightplan never "
            "unpickles untrusted data. Convert them to safetensors first.", file=str(path))
    raise CheckpointError("no .safetensors file in this directory", file=str(path))


def _variant_files(path: Path, variant: str) -> list[tuple[str, IndexShard | None]]:
    """``variant``'s one file, else the shards its index names."""
    single, index = path / variant_single(variant), path / variant_index(variant)
    if single.is_file():
        return [(str(single), None)]
    if index.is_file():
        return index_files(index)
    raise missing_variant(path, variant)


def _left_out(path: Path, files: list[tuple[str, IndexShard | None]],
              variant: str | None = None) -> tuple[tuple[str, str], ...]:
    """``path``'s ``.safetensors`` files that are not among ``files``, each with why."""
    read = {Path(f).name for f, _ in files}
    if len(files) == 1 and files[0][1] is None and Path(files[0][0]).parent == path:
        why = f"{Path(files[0][0]).name} is read alone (as transformers reads it)"
    else:
        why = "the index doesn't name it (transformers reads only the shards it names)"
    return tuple((p.name, _variant_why(p.name, variant, why))
                 for p in sorted(path.glob("*.safetensors")) if p.name not in read)


def _variant_why(name: str, variant: str | None, why: str) -> str:
    """Why a file of another weight variant than the one read is left out."""
    other = variant_of(name)
    if other is None or other == variant:
        return why
    given = f"variant={variant!r}" if variant is not None else "no variant"
    return f"a file of the weight variant {other!r}, and the load is given {given}"


def _from_files(files: list[tuple[str, IndexShard | None]], *, description: str,
                left_out: tuple[tuple[str, str], ...] = ()) -> Checkpoint:
    """Each file's header read and checked against the index in turn (the first file at
    fault raises), then all entries in one dict, a key of two files refused."""
    specs: SpecCache = {}  # the files share one spec per (dtype, shape)
    keys: list[list[str]] = []
    made: list[list[TensorEntry]] = []
    metadata: dict[str, str] = {}
    stamps = []
    for path, shard in files:
        file_keys, file_entries, file_meta, stamp = _read_columns(path, specs)
        if shard is not None:
            shard.check(path, file_keys)
        keys.append(file_keys)
        made.append(file_entries)
        metadata.update(file_meta)
        stamps.append(stamp)
    entries = dict(zip(chain.from_iterable(keys), chain.from_iterable(made), strict=True))
    if len(entries) != sum(map(len, keys)):
        _refuse_repeats(keys, [path for path, _ in files])
    return Checkpoint(entries, tuple(stamps), metadata=metadata, description=description,
                      left_out=left_out)


def _refuse_repeats(read: list[list[str]], paths: list[str]) -> None:
    """The error for the first key, in file order, that an earlier file also holds."""
    first: dict[str, str] = {}  # key → the file that holds it
    for path, keys in zip(paths, read, strict=True):
        key = next((k for k in keys if k in first), None)
        if key is not None:
            raise HeaderError(f"key also present in {first[key]}", file=path, key=key)
        first.update(dict.fromkeys(keys, path))


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Parse and validate one safetensors header; returns entries and ``__metadata__``."""
    keys, made, meta, _ = _read_columns(path)
    return dict(zip(keys, made, strict=True)), meta


def _read_columns(path: str, specs: SpecCache | None = None
                  ) -> tuple[list[str], list[TensorEntry], dict[str, str], FileStamp]:
    """The header of ``path`` as columns (:func:`header_columns`) and the file's
    :class:`FileStamp`, taken on the same open file and the same header bytes."""
    raw, data_start, size, stamp = _read_raw(path)
    return *header_columns(path, raw, data_start, size, specs), stamp


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
        why = ("it is JSON text; pass the checkpoint's directory or one of its .safetensors "
               "files" if head.lstrip()[:1] in (b"{", b"[")
               else f"its header length {n} is implausible for a {size}-byte file")
        raise NotSafetensorsError(f"not a safetensors file: {why}", file=path)
