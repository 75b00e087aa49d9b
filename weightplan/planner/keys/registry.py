"""The mapping registry: transforms registered by ``model_type`` or class name.

The registry is the one piece of process-wide state in weightplan, like a codec table:
built-in families are registered at import (:mod:`weightplan.planner.keys.mappings`) and
users add their own with :func:`register_mapping`.
"""

from __future__ import annotations

import difflib

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from weightplan.errors import RegistryError
from weightplan.planner.keys.transforms import WeightTransform
from weightplan.units import counted


class Via(Enum):
    """How a submodule's mapping was found."""

    CLASS = "class"  # its class name is registered
    MODEL_TYPE = "model_type"  # its ``config.model_type`` is registered


class Source(Enum):
    """Where a mapping came from."""

    REGISTRY = "registry"  # weightplan's registry (built-in families, register_mapping)
    TRANSFORMERS = "transformers"  # translated from transformers' own conversion mapping


@dataclass(frozen=True)
class SubmoduleMapping:
    """What the depth-first lookup decided for one submodule (see :mod:`planner.lookup`).

    ``skipped_for`` is set when the submodule was skipped because the ancestor at that
    path already claimed the same identifier; then ``transforms`` is empty.
    """

    path: str  # dotted module path, "" for the root
    class_name: str
    model_type: str | None
    identifier: str  # the class name or model_type that was looked up
    via: Via
    key: str  # the registered key the identifier resolved to (aliases followed)
    source: Source = Source.REGISTRY
    transforms: tuple[WeightTransform, ...] = ()  # scoped to ``path``
    skipped_for: str | None = None
    problems: tuple[str, ...] = ()  # parts of a bridged mapping that could not be used

    @property
    def applied(self) -> bool:
        return self.skipped_for is None

    def how(self) -> str:
        """``model_type 'gemma3' (alias of 'llava')`` / ``class LlavaModel``."""
        name = f"class {self.identifier}" if self.via is Via.CLASS else (
            f"model_type {self.identifier!r}")
        if self.key != self.identifier:
            name += f" (alias of {self.key!r})"
        if self.source is Source.TRANSFORMERS:
            name += " via the transformers bridge"
        return name

    def describe(self) -> str:
        """One line for the explanation header."""
        where = self.path or "<root>"
        if not self.applied:
            owner = self.skipped_for or "<root>"
            name = f"class {self.identifier}" if self.via is Via.CLASS else (
                f"model_type {self.identifier!r}")
            return f"{where} ({self.class_name}): skipped, {name} already claimed by {owner}"
        scope = f"scoped to {self.path}.*" if self.path else "unscoped"
        bad = f"; {counted(len(self.problems), 'part')} not translated" if self.problems else ""
        # (the base model's renamings are also copied unscoped, as transformers runs them)
        outside = sum(1 for t in self.transforms if not t.scope_prefix) if self.path else 0
        if outside:
            scope += (f" (its {counted(outside, 'renaming')} also outside it: the base model's, "
                      "as transformers applies them)")
        return (f"{where} ({self.class_name}): {self.how()}, "
                f"{counted(len(self.transforms) - outside, 'transform')}, {scope}{bad}")


@dataclass(frozen=True)
class MappingChoice:
    """Which registered mapping(s) a model got, and why (shown in the explanation).

    ``transforms`` is everything that applies, in order (root first, then each
    submodule's scoped copy, depth first); ``submodules`` says who got what.
    """

    key: str | None  # registered key of the first mapping applied (None: no mapping found)
    reason: str
    transforms: tuple[WeightTransform, ...]
    submodules: tuple[SubmoduleMapping, ...] = ()

    @property
    def applied(self) -> tuple[SubmoduleMapping, ...]:
        return tuple(s for s in self.submodules if s.applied)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(f"{s.path or '<root>'}: {p}" for s in self.applied for p in s.problems)


class MappingRegistry:
    """Named lists of transforms, plus aliases that point one name at another."""

    def __init__(self) -> None:
        self._mappings: dict[str, tuple[WeightTransform, ...]] = {}
        self._aliases: dict[str, str] = {}

    def register(self, key: str, transforms: Iterable[WeightTransform], *,
                 overwrite: bool = False) -> None:
        items = tuple(transforms)
        if not isinstance(key, str) or not key:
            raise RegistryError(f"a mapping key must be a non-empty string, got {key!r}")
        if not all(isinstance(t, WeightTransform) for t in items):
            bad = next(t for t in items if not isinstance(t, WeightTransform))
            raise RegistryError(f"mapping {key!r}: {bad!r} is not a WeightTransform")
        if key in self and not overwrite:
            raise RegistryError(f"a mapping for {key!r} is already registered; pass "
                                "overwrite=True to replace it")
        self._aliases.pop(key, None)
        self._mappings[key] = items

    def alias(self, alias: str, key: str, *, overwrite: bool = False) -> None:
        if alias in self and not overwrite:
            raise RegistryError(f"a mapping for {alias!r} is already registered; pass "
                                "overwrite=True to replace it")
        if self.resolve(key) is None:
            raise RegistryError(f"can't alias {alias!r} to unknown mapping {key!r}")
        self._mappings.pop(alias, None)
        self._aliases[alias] = key

    def resolve(self, key: str) -> str | None:
        seen = set()
        while key in self._aliases and key not in seen:
            seen.add(key)
            key = self._aliases[key]
        return key if key in self._mappings else None

    def get(self, key: str) -> list[WeightTransform]:
        target = self.resolve(key)
        if target is None:
            close = difflib.get_close_matches(str(key), self.keys(), n=5, cutoff=0.6)
            known = f"did you mean {', '.join(close)}?" if close else \
                f"known: {', '.join(self.keys()[:12])}, ..."
            raise RegistryError(f"no mapping registered for {key!r}; {known}")
        return list(self._mappings[target])

    def __contains__(self, key: object) -> bool:
        return key in self._mappings or key in self._aliases

    def keys(self) -> list[str]:
        return sorted({*self._mappings, *self._aliases})
