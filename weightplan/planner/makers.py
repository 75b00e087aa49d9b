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
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """``maker(cls)(*fields)`` equals ``cls(*fields)`` (all fields, in order, positional).

    Example:
        ``make = maker(PatternMatch); match = make(start, end, index, groups)``.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if (not hasattr(cls, "__slots__") or hasattr(cls, "__post_init__")
            or not all(f.init for f in fields)):
        raise TypeError(f"maker() needs a slotted dataclass without __post_init__ whose "
                        f"fields are all set by __init__; {cls.__name__} is not one")
    names = [f.name for f in fields]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    lines = [f"def make({', '.join(names)}):", "    self = _new(_cls)"]
    lines += [f"    _set_{n}(self, {n})" for n in names]
    exec("\n".join([*lines, "    return self"]), scope)  # as dataclasses builds __init__
    return scope["make"]
