"""The mapping registry: transforms registered by ``model_type`` or class name.

The registry is the one piece of process-wide state in weightplan, like a codec table:
built-in families are registered at import (:mod:`weightplan.planner.mappings`) and
users add their own with :func:`register_mapping`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from weightplan.errors import RegistryError
from weightplan.planner.transforms import WeightTransform


@dataclass(frozen=True)
class MappingChoice:
    """Which registered mapping a model got, and why (shown in the explanation)."""

    key: str | None  # registered key used (None: no mapping found)
    reason: str
    transforms: tuple[WeightTransform, ...]


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
            known = ", ".join(sorted(self.keys())[:12])
            raise RegistryError(f"no mapping registered for {key!r} (known: {known}, ...)")
        return list(self._mappings[target])

    def __contains__(self, key: object) -> bool:
        return key in self._mappings or key in self._aliases

    def keys(self) -> list[str]:
        return sorted({*self._mappings, *self._aliases})

    def choose(self, model: torch.nn.Module) -> MappingChoice:
        """Class name first, then ``config.model_type``, at the model's root."""
        class_name = type(model).__name__
        if class_name in self:
            return MappingChoice(class_name, f"class {class_name}", tuple(self.get(class_name)))
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if isinstance(model_type, str) and model_type in self:
            how = f"model_type {model_type!r}"
            if self.resolve(model_type) != model_type:
                how += f" (alias of {self.resolve(model_type)!r})"
            return MappingChoice(model_type, how, tuple(self.get(model_type)))
        what = f"class {class_name}" + (f", model_type {model_type!r}" if model_type else "")
        return MappingChoice(None, f"no registered mapping for {what}: keys are used as they "
                                   "are (plus legacy renames)", ())


REGISTRY = MappingRegistry()


def register_mapping(key: str, transforms: Iterable[WeightTransform], overwrite: bool = False
                     ) -> None:
    """Register ``transforms`` under a ``model_type`` or class name.

    Raises:
        RegistryError: ``key`` is already registered and ``overwrite`` is false.

    Example:
        >>> register_mapping("my_moe", [WeightRenaming(".moe.", ".mlp.")])  # doctest: +SKIP
    """
    REGISTRY.register(key, transforms, overwrite=overwrite)


def get_mapping(key: str) -> list[WeightTransform]:
    """The transforms registered under ``key`` (aliases followed), as a new list."""
    return REGISTRY.get(key)


def register_alias(alias: str, key: str, overwrite: bool = False) -> None:
    """Make ``alias`` resolve to the mapping registered under ``key``."""
    REGISTRY.alias(alias, key, overwrite=overwrite)
