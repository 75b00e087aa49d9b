"""A stored weight of a packed checkpoint as routing sees it
(:mod:`weightplan.planner.inputs.packed_pairs`): its logical entry, which carries the
scheme and the parts that dequantize it. One object per stored weight (Kimi-K2: 69k),
made column by column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import repeat
from operator import attrgetter

import torch

from weightplan.planner.core.entry import TensorEntry
from weightplan.planner.core.makers import fill, slot_setters
from weightplan.planner.core.quant.formats import Scheme
from weightplan.planner.core.spec import TensorSpec


class PackedWeight(TensorEntry):
    """A stored weight as routing sees it: the logical entry (its logical key and shape,
    nominally bf16: never read as such, always behind a dequantize, at its stored
    weight's place) with its ``scheme`` and ``parts`` (in ``scheme.roles`` order)."""

    __slots__ = ("scheme", "parts")
    scheme: Scheme
    parts: tuple[TensorEntry, ...]

    def __new__(cls, key: str, scheme: Scheme, parts: tuple[TensorEntry, ...],
                shape: tuple[int, ...]) -> PackedWeight:
        return object.__new__(cls)

    def __init__(self, key: str, scheme: Scheme, parts: tuple[TensorEntry, ...],
                 shape: tuple[int, ...]) -> None:
        _fill([self], (key,), (logical_spec(shape),), (scheme,), (parts,), parts[:1])

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def stored_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return _WEIGHT_ROW(self) == _WEIGHT_ROW(other)

    def __hash__(self) -> int:
        return hash(_WEIGHT_ROW(self))

    def __repr__(self) -> str:
        return f"PackedWeight(key={self.key!r}, scheme={self.scheme!r}, parts={self.parts!r})"

    def __reduce__(self) -> tuple:
        return PackedWeight, (self.key, self.scheme, self.parts, self.shape)


@lru_cache(maxsize=1024)
def logical_spec(shape: tuple[int, ...]) -> TensorSpec:
    """The logical spec of a weight of ``shape``, one object per shape: the weights of
    every stack (a layer's experts span several key templates: ``experts.1``,
    ``experts.11``, ``experts.111``) share it, so the passes that tell specs apart by
    identity first (a merge's stacked specs, the lowering's and verify's geometry) see one
    spec where there is one."""
    return TensorSpec(tuple(shape), torch.bfloat16)


def packed_weight(entry: TensorEntry) -> PackedWeight | None:
    """``entry`` when it is a stored weight's logical entry, else ``None``."""
    return entry if type(entry) is PackedWeight else None


_WEIGHT_SETTERS = slot_setters(PackedWeight, ("key", "spec", "file", "offset", "scheme", "parts"))
_WEIGHT_ROW = attrgetter("key", "spec", "scheme", "parts")


def _fill(made: list[PackedWeight], keys: Iterable[str], specs: Iterable[TensorSpec],
          schemes: Iterable[Scheme], parts: Iterable[tuple[TensorEntry, ...]],
          firsts: Sequence[TensorEntry]) -> None:
    """Each of ``made`` (new) given its row, its file and offset its first part's
    (``firsts``)."""
    fill(made, _WEIGHT_SETTERS, (keys, specs, map(_FILE, firsts), map(_OFFSET, firsts),
                                 schemes, parts))


def packed_weights(count: int, keys: Iterable[str], specs: Iterable[TensorSpec],
                   schemes: Iterable[Scheme], parts: Iterable[tuple[TensorEntry, ...]],
                   firsts: Sequence[TensorEntry]) -> list[PackedWeight]:
    """``count`` new weights, built column by column (``firsts``: each one's first
    part)."""
    made: list[PackedWeight] = list(map(object.__new__, repeat(PackedWeight, count)))
    _fill(made, keys, specs, schemes, parts, firsts)
    return made


_FILE, _OFFSET = attrgetter("file"), attrgetter("offset")
