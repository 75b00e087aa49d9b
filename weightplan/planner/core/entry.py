"""One checkpoint tensor: where its bytes are and what they hold.

A checkpoint keeps one :class:`TensorEntry` per key for as long as its plan lives (92k on
DeepSeek-V3), so the entry is a frozen class of four slots (64 bytes; a dataclass with a
``contiguous`` field took 72, a named tuple takes 80) whose specs are shared by every
entry of the same dtype and shape. :func:`build_entries` makes a header's worth at C speed
(slot setters mapped over columns), where a frozen dataclass's ``__init__`` spends ~0.5 µs
a key in ``object.__setattr__`` calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter

from weightplan.planner.core.makers import fill, slot_setters
from weightplan.planner.core.spec import TensorSpec

__all__ = ["FrozenEntryError", "StridedEntry", "TensorEntry", "build_entries"]

_FIELDS = ("key", "spec", "file", "offset")


class FrozenEntryError(AttributeError):
    """A :class:`TensorEntry` was assigned to: entries are immutable (and hashed)."""


class TensorEntry:
    """One checkpoint tensor (immutable, hashable): ``key``, ``spec``, ``file`` (``None``:
    the tensor lives in an in-memory dict) and ``offset`` (the absolute byte offset of its
    first data byte in ``file``).

    ``contiguous`` is ``False`` only for an in-memory tensor with strides (file data never
    is); such an entry is a :class:`StridedEntry`, unequal to a contiguous one.
    """

    __slots__ = _FIELDS
    key: str
    spec: TensorSpec
    file: str | None
    offset: int

    def __new__(cls, key: str, spec: TensorSpec, file: str | None, offset: int = 0,
                contiguous: bool = True) -> TensorEntry:
        return object.__new__(cls if contiguous else StridedEntry)

    def __init__(self, key: str, spec: TensorSpec, file: str | None, offset: int = 0,
                 contiguous: bool = True) -> None:
        _SET_KEY(self, key)
        _SET_SPEC(self, spec)
        _SET_FILE(self, file)
        _SET_OFFSET(self, offset)

    @property
    def contiguous(self) -> bool:
        return True

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenEntryError(f"cannot assign to field {name!r}: a TensorEntry is immutable")

    def __delattr__(self, name: str) -> None:
        raise FrozenEntryError(f"cannot delete field {name!r}: a TensorEntry is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return _ROW(self) == _ROW(other)

    def __hash__(self) -> int:
        return hash(_ROW(self))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(key={self.key!r}, spec={self.spec!r}, "
                f"file={self.file!r}, offset={self.offset!r})")

    def __reduce__(self) -> tuple:
        return type(self), _ROW(self)


class StridedEntry(TensorEntry):
    """An in-memory tensor that is not contiguous (its bytes are no single run)."""

    __slots__ = ()

    @property
    def contiguous(self) -> bool:
        return False


_SETTERS = slot_setters(TensorEntry, _FIELDS)  # (past the refusing __setattr__)
_SET_KEY, _SET_SPEC, _SET_FILE, _SET_OFFSET = _SETTERS
_ROW = attrgetter(*_FIELDS)


def build_entries(keys: list[str], specs: Iterable[TensorSpec], file: str,
                  offsets: Iterable[int]) -> list[TensorEntry]:
    """``TensorEntry(key, spec, file, offset)`` for each row, built column by column."""
    made = list(map(object.__new__, repeat(TensorEntry, len(keys))))
    fill(made, _SETTERS, (keys, specs, repeat(file), offsets))
    return made
