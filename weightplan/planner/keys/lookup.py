"""Depth-first mapping lookup over a model's submodules (SPEC §5).

For each submodule, in ``model.named_modules()`` order (pre-order, the root first):

1. skip it when an ancestor already claimed its class name;
2. look its class name up, then its ``model_type`` (not when an ancestor already claimed
   it: then the submodule is skipped unless its class name finds something). The
   sources are weightplan's registry and, only for submodules whose class name and
   ``model_type`` the registry doesn't know, the bridge (transformers' own registered
   mappings, for transformers classes): each identifier is asked of the registry first;
4. a hit is scoped to the submodule's dotted path (the root's stays unscoped) and claims
   the class name; a ``model_type`` hit also claims the ``model_type``. A class hit
   leaves the ``model_type`` free, so another submodule that only has that
   ``model_type`` is still reached.

Siblings are never ancestors of each other, so each gets its own scoped copy. Class
names are looked up on every module; ``model_type`` on the root and on sub-models
(transformers ``PreTrainedModel`` subclasses, or any module from outside transformers
that carries ``config.model_type``), so attention layers holding a config are not
mistaken for sub-models. Two mappings that convert the same source pattern of one
submodule differently are ambiguous: :class:`ConflictingTransformError` names both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from torch import nn

from weightplan.errors import ConflictingTransformError
from weightplan.planner.core.problems import Note, Problem, ProblemKind
from weightplan.planner.inputs.model_init import declared_attr
from weightplan.planner.keys.registry import (
    MappingChoice, MappingRegistry, Source, SubmoduleMapping, Via,
)
from weightplan.planner.keys.transforms import WeightConverter, WeightRenaming, WeightTransform
from weightplan.units import counted


@dataclass(frozen=True)
class Found:
    """A mapping found for one identifier, before scoping."""

    key: str  # registered key (aliases followed)
    transforms: tuple[WeightTransform, ...]
    source: Source = Source.REGISTRY
    problems: tuple[str, ...] = ()


Finder = Callable[[nn.Module, str], "Found | None"]
"""``finder(module, identifier)``: a mapping from outside the registry (the bridge)."""


@dataclass
class _Walk:
    """State of one lookup: who claimed which identifier, and what was decided."""

    registry: MappingRegistry
    bridge: Finder | None
    claimed: dict[str, list[str]]
    skipped: dict[str, list[str]]
    entries: list[SubmoduleMapping]
    base: str | None = None  # the root's ``base_model_prefix``

    def find(self, module: nn.Module, identifier: str, bridge: bool = True) -> Found | None:
        key = self.registry.resolve(identifier)
        if key is not None:
            return Found(key, tuple(self.registry.get(identifier)))
        if bridge and self.bridge is not None:
            return self.bridge(module, identifier)
        return None


def lookup_mapping(model: nn.Module, registry: MappingRegistry, *,
                   bridge: Finder | None = None) -> MappingChoice:
    """Walk ``model`` depth first and collect every submodule's scoped mapping.

    Args:
        model: the model; its submodules are visited in ``named_modules()`` order.
        registry: where class names and ``model_type`` strings are looked up.
        bridge: optional second source, asked when the registry has nothing.

    Returns:
        A :class:`MappingChoice` whose ``transforms`` are the scoped lists in visit
        order and whose ``submodules`` say who got what and why (skips included).

    Raises:
        ConflictingTransformError: two mappings convert one submodule's keys differently.
    """
    walk = _Walk(registry, bridge, {}, {}, [], getattr(model, "base_model_prefix", None) or None)
    idle: set[type] = set()  # (classes whose modules find nothing: see _idle)
    for path, module in model.named_modules():
        cls = type(module)
        if cls in idle and "config" not in vars(module) and cls.__name__ not in walk.claimed:
            continue  # (a model of 1M plain modules: ~1.5 µs each spared)
        _visit(walk, path, module)
        if _idle(walk, cls):
            idle.add(cls)
    applied = [e for e in walk.entries if e.applied]
    check_ambiguous(applied)
    transforms = tuple(t for e in applied for t in e.transforms)
    return MappingChoice(applied[0].identifier if applied else None, _reason(model, applied),
                         transforms, tuple(walk.entries))


def _idle(walk: _Walk, cls: type) -> bool:
    """Whether a module of ``cls`` without a ``config`` of its own finds nothing while its
    class name is unclaimed: no ``model_type`` (the class declares no ``config``), a class
    name the registry doesn't know, and no bridge to ask (it may answer per module)."""
    return walk.bridge is None and not hasattr(cls, "config") and \
        walk.registry.resolve(cls.__name__) is None


def _visit(walk: _Walk, path: str, module: nn.Module) -> None:
    class_name = type(module).__name__
    claimed = walk.claimed.get(class_name)
    if claimed is not None and _claimed_above(claimed, path):
        _skip(walk, path, module, class_name, Via.CLASS)
        return
    model_type = model_type_of(module)
    typed = model_type is not None and (path == "" or is_submodel(module))
    blocked = model_type is not None and typed and _claimed_above(
        walk.claimed.get(model_type, ()), path)
    choices = [(Via.CLASS, class_name)]
    if model_type is not None and typed and not blocked:
        choices.append((Via.MODEL_TYPE, model_type))
    for via, identifier in choices:
        found = walk.find(module, identifier, bridge=walk.bridge is not None
                          and not _known(walk, class_name, model_type))
        if found is not None:
            _apply(walk, path, module, identifier, via, found)
            return
    if blocked and model_type is not None:
        _skip(walk, path, module, model_type, Via.MODEL_TYPE)


def _known(walk: _Walk, class_name: str, model_type: str | None) -> bool:
    """The registry covers this family: the bridge isn't asked (building transformers'
    table costs about 0.1 s the first time)."""
    return walk.registry.resolve(class_name) is not None or (
        model_type is not None and walk.registry.resolve(model_type) is not None)


def _apply(walk: _Walk, path: str, module: nn.Module, identifier: str, via: Via,
           found: Found) -> None:
    scoped = tuple(t.with_scope(path) if path else t for t in found.transforms)
    if path and path == walk.base:  # transformers scopes the base model's mapping with its
        # prefix optional: its renamings rename the head's keys too (ViTMAE's decoder), and
        # each key once (the copy leaves the scoped one's keys alone)
        scoped += tuple(replace(t, outside=path) for t in found.transforms
                        if isinstance(t, WeightRenaming) and not t.scope_prefix)
    walk.entries.append(SubmoduleMapping(
        path, type(module).__name__, model_type_of(module), identifier, via, found.key,
        found.source, scoped, None, found.problems))
    walk.claimed.setdefault(type(module).__name__, []).append(path)
    if via is Via.MODEL_TYPE:
        walk.claimed.setdefault(identifier, []).append(path)


def _skip(walk: _Walk, path: str, module: nn.Module, identifier: str, via: Via) -> None:
    """Record a skip once per claim: not again under a module already skipped for it."""
    if _claimed_above(walk.skipped.get(identifier, ()), path):
        return
    found = walk.find(module, identifier)
    model_type = model_type_of(module)
    if found is None and via is Via.CLASS and model_type and is_submodel(module):
        found = walk.find(module, model_type)  # what it would have got otherwise
    if found is None:
        return
    owner = _nearest(walk.claimed[identifier], path)
    walk.skipped.setdefault(identifier, []).append(path)
    walk.entries.append(SubmoduleMapping(
        path, type(module).__name__, model_type_of(module), identifier, via, found.key,
        found.source, (), owner))


def _claimed_above(paths: Iterable[str], path: str) -> bool:
    return any(p == "" or path.startswith(p + ".") for p in paths)


def _nearest(paths: list[str], path: str) -> str:
    above = [p for p in paths if p == "" or path.startswith(p + ".")]
    return max(above, key=len)


def model_type_of(module: nn.Module) -> str | None:
    """``module.config.model_type`` when it is a non-empty string, else ``None``."""
    model_type = getattr(declared_attr(module, "config"), "model_type", None)
    return model_type if isinstance(model_type, str) and model_type else None


def is_submodel(module: nn.Module) -> bool:
    """A transformers ``PreTrainedModel``, or a non-transformers module with a config."""
    if any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__):
        return True
    return not is_transformers_class(module) and model_type_of(module) is not None


def is_transformers_class(module: nn.Module) -> bool:
    """The module's class is defined inside the transformers package (not remote code)."""
    return type(module).__module__.startswith("transformers.")


def _reason(model: nn.Module, applied: list[SubmoduleMapping]) -> str:
    if not applied:
        model_type = model_type_of(model)
        what = f"class {type(model).__name__}" + (
            f", model_type {model_type!r}" if model_type else "")
        return (f"no registered mapping for {what} or its submodules: keys are used as "
                "they are (plus legacy renames)")
    first = applied[0]
    reason = first.how() + (f" at {first.path}" if first.path else "")
    if len(applied) > 1:
        reason += f"; {counted(len(applied) - 1, 'more submodule mapping')}, scoped"
    return reason


def check_ambiguous(applied: list[SubmoduleMapping]) -> None:
    """Raise when an outer and an inner mapping convert one source pattern differently."""
    for i, outer in enumerate(applied):
        for inner in applied[i + 1:]:
            if outer.path and not inner.path.startswith(outer.path + "."):
                continue
            for a in _converters(outer):
                for b in _converters(inner):
                    shared = set(a.source_patterns) & set(b.source_patterns)
                    if shared and not _same_conversion(a, b):
                        raise ConflictingTransformError(
                            f"ambiguous mappings for submodule {inner.path}: "
                            f"{outer.how()} at {outer.path or '<root>'} converts "
                            f"{sorted(shared)[0]!r} with {a.describe()}, and {inner.how()} "
                            f"at {inner.path} with {b.describe()}; register one mapping for "
                            "it (overwrite=True) or drop the converter from one of them")


def _converters(entry: SubmoduleMapping) -> list[WeightConverter]:
    return [t for t in entry.transforms if isinstance(t, WeightConverter)]


def _same_conversion(a: WeightConverter, b: WeightConverter) -> bool:
    return (a.source_patterns, a.target_patterns, a.operations) == (
        b.source_patterns, b.target_patterns, b.operations)


def mapping_findings(choice: MappingChoice, *, looked_up: bool
                     ) -> tuple[list[Problem], list[Note]]:
    """Problems (parts of a bridged mapping weightplan can't run) and the no-mapping note."""
    problems = [Problem(ProblemKind.MAPPING, s.path or s.identifier, f"{s.how()}: {p}")
                for s in choice.applied for p in s.problems]
    notes = [Note("", choice.reason)] if looked_up and not choice.applied else []
    return problems, notes
