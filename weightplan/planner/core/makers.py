"""Building frozen plan items by the ten thousand: a constructor without the generated
``__init__``'s cost.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (looked
up globally, then called); for a slotted one, :func:`maker` writes the slots directly
through their descriptors instead, which is about twice as fast. Only for classes whose
``__init__`` does nothing else: slots, no ``__post_init__``, no ``InitVar``, every field
passed (defaults are not filled in).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any, TypeVar

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """``maker(cls)(*fields)`` equals ``cls(*fields)`` (all fields, in order, positional).

    Example:
        ``make = maker(PatternMatch); match = make(start, end, index, groups)``.
    """
    names = _field_names(cls, "maker")
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    lines = [f"def make({', '.join(names)}):", "    self = _new(_cls)"]
    lines += [f"    _set_{n}(self, {n})" for n in names]
    exec("\n".join([*lines, "    return self"]), scope)  # as dataclasses builds __init__
    return scope["make"]


def columns(cls: type[T]) -> Callable[..., list[T]]:
    """``columns(cls)(count, *values)``: ``count`` objects equal to ``cls(*fields)``, field
    ``k`` of each taken from the iterable ``values[k]`` (all fields, in order). Each slot is
    written for all of them in one C-level pass (its descriptor's ``__set__`` mapped over
    the objects): for the 256 experts of a stack, about three times as fast as
    :func:`maker` called 256 times. Same conditions as :func:`maker`.

    Example:
        ``tasks = columns(ReadTask)(n, nodes, repeat(region), fragments, repeat(layout))``.
    """
    setters = [getattr(cls, name).__set__ for name in _field_names(cls, "columns")]

    def make(count: int, *values: Iterable[Any]) -> list[T]:
        return filled(cls, count, zip(setters, values, strict=True))
    return make


def filled(cls: type[T], count: int,
           slots: Iterable[tuple[Callable[[Any, Any], None], Iterable[Any]]]) -> list[T]:
    """``count`` new ``cls`` objects (``__init__`` not run), each ``(setter, values)`` of
    ``slots`` writing one slot of all of them in one C-level pass (``setter``: the slot
    descriptor's ``__set__``). The caller writes every slot the class has; :func:`columns`
    is the checked form for slotted dataclasses."""
    made: list[T] = list(map(_NEW, repeat(cls, count)))
    for setter, values in slots:
        deque(map(setter, made, values), maxlen=0)  # runs each map to its end
    return made


_NEW = object.__new__


def _field_names(cls: type, who: str) -> list[str]:
    fields = dataclasses.fields(cls)
    if (not hasattr(cls, "__slots__") or hasattr(cls, "__post_init__")
            or not all(f.init for f in fields)):
        raise TypeError(f"{who}() needs a slotted dataclass without __post_init__ whose "
                        f"fields are all set by __init__; {cls.__name__} is not one")
    return [f.name for f in fields]
