"""A sharded checkpoint's ``*.safetensors.index.json``: which files hold which keys.

:func:`index_files` reads the index (strict JSON, bounded size, shard names confined to
its directory) and lists the shards it names, each with an :class:`IndexShard` that checks
the shard's header holds every key the index places there.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Mapping
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

from weightplan.errors import CheckpointError, HeaderError, MissingShardError
from weightplan.planner.inputs.paths import open_regular, pread_exactly, shard_path
from weightplan.planner.inputs.safetensors_format import MAX_INDEX_BYTES, strict_json

__all__ = ["IndexShard", "index_files"]


def read_index(index: Path) -> dict[str, str]:
    """The ``weight_map`` of an index file: strict JSON, bounded size, strings only."""
    fd = open_regular(str(index))
    try:
        size = os.fstat(fd).st_size
        if size > MAX_INDEX_BYTES:
            raise HeaderError(f"index is {size} bytes, more than the {MAX_INDEX_BYTES} "
                              "weightplan reads", file=str(index))
        raw = pread_exactly(fd, size, 0, str(index))
    except OSError as e:
        raise HeaderError(f"unreadable index: {e}", file=str(index)) from e
    finally:
        os.close(fd)
    data = strict_json(raw, file=str(index), what="index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise HeaderError("unreadable index: no \"weight_map\" object", file=str(index))
    return weight_map


class IndexShard(NamedTuple):
    """What an index says one shard holds: the keys ``weight_map`` maps to ``name``."""

    name: str
    weight_map: Mapping[str, str]
    size: int  # how many keys the index places in this shard

    def holds(self, keys: Collection[str]) -> bool:
        """Whether every key placed here is among the shard's header ``keys``, which are
        distinct (counted at C speed: ``size`` of them mapped here means all)."""
        return list(map(self.weight_map.get, keys)).count(self.name) == self.size

    def check(self, path: str, keys: Collection[str]) -> None:
        """:meth:`holds` for the header ``keys`` (distinct), else the error naming a key
        placed here that they lack."""
        if self.holds(keys):
            return
        found = set(keys)
        for key, name in self.weight_map.items():
            if name == self.name and key not in found:
                raise HeaderError("the index places this key here but the file's header "
                                  "lacks it", file=path, key=key)


def index_files(index: Path) -> list[tuple[str, IndexShard | None]]:
    """The shards ``index`` names, sorted by name, each with what it must hold."""
    weight_map = read_index(index)
    try:
        counts = Counter(weight_map.values())
        names = list(counts)  # each name once, in index order
    except TypeError:  # an unhashable name: checked in index order, it is refused below
        counts, names = Counter(), list(weight_map.values())
    # each name checked once, in index order: refused outside the directory first
    placed = [(name, shard_path(index, name)) for name in names]
    files: list[tuple[str, IndexShard | None]] = []
    for name, shard in sorted(placed, key=itemgetter(0)):
        if not _exists(shard, index):
            first = next(k for k, n in weight_map.items() if n == name)
            raise MissingShardError(
                f"the index names shard {name!r} (holding {first!r} and "
                f"{counts[name] - 1} more keys) but it does not exist", file=str(index))
        files.append((str(shard), IndexShard(name, weight_map, counts[name])))
    return files


def _exists(shard: Path, index: Path) -> bool:
    try:
        return shard.exists()
    except (OSError, ValueError) as e:
        raise CheckpointError(f"can't use shard path {shard.name!r}: {e}", file=str(index)) from e
