"""Transforms: how checkpoint keys become model keys.

Three kinds, as in the design text:

* :class:`WeightRenaming` rewrites the matched part of a key (every matching renaming
  fires, in list order, chained);
* :class:`PrefixChange` adds or removes one whole key component;
* :class:`WeightConverter` routes keys to a conversion group whose tensors run through
  ops (the first converter that matches claims the key).

Transforms are frozen and hashable; ``scope_prefix`` restricts one to keys under a
dotted module path (the prefix is stripped before matching and put back after).
Every transform has an :meth:`inverse`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from weightplan.errors import MappingError, NotInvertibleError, PatternError
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.keys.patterns import (
    PatternMatch, SourcePattern, TargetPattern, compile_source, compile_target,
    source_to_target, target_to_source,
)
from weightplan.units import counted


def _as_tuple(patterns: object, what: str) -> tuple[str, ...]:
    if isinstance(patterns, str):
        return (patterns,)
    if not isinstance(patterns, Iterable):
        raise MappingError(f"{what} must be a string or a list of strings, got {patterns!r}")
    try:
        out = tuple(patterns)
    except TypeError as e:
        raise MappingError(f"{what} must be a string or a list of strings, got {patterns!r}") from e
    if not out or not all(isinstance(p, str) for p in out):
        raise MappingError(f"{what} must be a non-empty list of strings, got {patterns!r}")
    return out


def join_scope(outer: str | None, inner: str | None) -> str | None:
    parts = [p for p in (outer, inner) if p]
    if not parts:
        return outer if outer is not None else inner
    return ".".join(parts)


class WeightTransform:
    """Base of all transforms. ``scope_prefix`` limits it to keys under a module path."""

    scope_prefix: str | None

    def split_scope(self, key: str) -> tuple[str, str] | None:
        """``(prefix, rest)`` when ``key`` is in scope, else ``None``."""
        if not self.scope_prefix:
            return "", key
        head = self.scope_prefix + "."
        return (head, key[len(head):]) if key.startswith(head) else None

    def with_scope(self, prefix: str | None) -> "WeightTransform":
        """A copy scoped under ``prefix`` (nested inside any scope it already has)."""
        copy: Any = self  # every concrete transform is a dataclass with a scope_prefix field
        return dataclasses.replace(copy, scope_prefix=join_scope(prefix, self.scope_prefix))

    def may_match(self, text: str) -> bool:
        """False only where no key whose name ``text`` holds can match (renamings of the
        user's own, and prefix changes: always True)."""
        return True

    def inverse(self) -> "WeightTransform":
        raise NotInvertibleError(f"{self!r} has no inverse")

    def describe(self) -> str:
        raise NotImplementedError

    def _where(self) -> str:
        """`` in model.vision_tower.*`` for a scoped transform (shown in descriptions)."""
        return f" in {self.scope_prefix}.*" if self.scope_prefix else ""


class Renaming(WeightTransform):
    """A transform that renames one key to one key."""

    def rename(self, key: str) -> str | None:
        """The new key, or ``None`` when this renaming does not fire on ``key``."""
        raise NotImplementedError


@dataclass(frozen=True)
class PatternTransform(WeightTransform):
    """Fields and matching shared by transforms written as source / target patterns."""

    source_patterns: tuple[str, ...]
    target_patterns: tuple[str, ...]
    scope_prefix: str | None = field(default=None, kw_only=True)
    _sources: tuple[SourcePattern, ...] = field(init=False, repr=False, compare=False)
    _targets: tuple[TargetPattern, ...] = field(init=False, repr=False, compare=False)

    @property
    def sources(self) -> tuple[SourcePattern, ...]:
        return self._sources

    def may_match(self, text: str) -> bool:
        """Whether ``text`` holds the scope and some source's literal (every match holds
        its source's :func:`~.patterns.required_literal`)."""
        if self.scope_prefix and self.scope_prefix + "." not in text:
            return False
        return any(s.literal in text for s in self._sources)

    def first_match(self, key: str) -> tuple[int, str, str, PatternMatch] | None:
        """The first source matching ``key`` in scope: (index, scope head, rest, match)."""
        scoped = self.split_scope(key)
        if scoped is None:
            return None
        head, rest = scoped
        for i, source in enumerate(self._sources):
            m = source.search(rest)
            if m is not None:
                return i, head, rest, m
        return None


@dataclass(frozen=True, init=False)
class WeightRenaming(PatternTransform, Renaming):
    """Rewrite the matched substring of a key.

    Args:
        source_patterns: regex(es) searched in the key (see :mod:`patterns`).
        target_patterns: one target for all sources, or one per source.
        scope_prefix: only keys under this dotted path are considered.
        outside: keys under this dotted path are left alone (the base model's renamings
            run on the head's keys, as transformers runs them: its scoped copy renames its
            own keys, once).

    Example:
        ``WeightRenaming(".block_sparse_moe.", ".mlp.")`` turns
        ``model.layers.0.block_sparse_moe.gate.weight`` into ``model.layers.0.mlp.gate.weight``.
    """

    outside: str | None = field(default=None, kw_only=True)

    def __init__(self, source_patterns: str | Sequence[str], target_patterns: str | Sequence[str],
                 *, scope_prefix: str | None = None, outside: str | None = None) -> None:
        sources = _as_tuple(source_patterns, "source_patterns")
        targets = _as_tuple(target_patterns, "target_patterns")
        _set(self, scope_prefix=scope_prefix, outside=outside)
        if len(targets) not in (1, len(sources)):
            raise MappingError(f"WeightRenaming needs one target or one per source; got "
                               f"{len(sources)} sources and {len(targets)} targets")
        _set(self, source_patterns=sources, target_patterns=targets)
        _compile(self)

    def rename(self, key: str) -> str | None:
        found = self.first_match(key)
        if found is None:
            return None
        i, head, rest, m = found
        target = self._targets[i if len(self._targets) > 1 else 0]
        new = head + rest[:m.start] + target.expand(m.groups, m.index) + rest[m.end:]
        return new if new != key else None

    def inverse(self) -> "WeightRenaming":
        if len(self.source_patterns) > 1 and len(self.target_patterns) == 1:
            raise NotInvertibleError(f"{self.describe()}: several sources share one target, "
                                     "so the inverse can't tell which source to restore")
        return WeightRenaming(_inverse_sources(self), _inverse_targets(self),
                              scope_prefix=self.scope_prefix, outside=self.outside)

    def split_scope(self, key: str) -> tuple[str, str] | None:
        if self.outside and key.startswith(self.outside + "."):
            return None
        return super().split_scope(key)

    def describe(self) -> str:
        return (f"rename {_join(self.source_patterns)} → {_join(self.target_patterns)}"
                + self._where() + (f" outside {self.outside}.*" if self.outside else ""))


@dataclass(frozen=True)
class PrefixChange(Renaming):
    """Add or remove one whole leading key component (optionally under ``model_prefix``).

    Adding is idempotent: keys that already carry the prefix are left alone.

    Example:
        ``PrefixChange(prefix_to_add="model")``: ``layers.0.w`` → ``model.layers.0.w``;
        ``PrefixChange(prefix_to_remove="bad", model_prefix="model.layers")``:
        ``model.layers.bad.w`` → ``model.layers.w``.
    """

    prefix_to_add: str | None = field(default=None, kw_only=True)
    prefix_to_remove: str | None = field(default=None, kw_only=True)
    model_prefix: str | None = field(default=None, kw_only=True)
    scope_prefix: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if (self.prefix_to_add is None) == (self.prefix_to_remove is None):
            raise MappingError("PrefixChange needs exactly one of prefix_to_add / "
                               "prefix_to_remove")
        for name in ("prefix_to_add", "prefix_to_remove", "model_prefix"):
            value = getattr(self, name)
            if value is not None and (not value or value.startswith(".") or value.endswith(".")):
                raise MappingError(f"PrefixChange {name}={value!r} must be a dotted path")

    def rename(self, key: str) -> str | None:
        scoped = self.split_scope(key)
        if scoped is None:
            return None
        head, rest = scoped
        base = f"{self.model_prefix}." if self.model_prefix else ""
        if not rest.startswith(base):
            return None
        tail = rest[len(base):]
        if self.prefix_to_add is not None:
            if tail.startswith(self.prefix_to_add + ".") or not tail:
                return None
            return f"{head}{base}{self.prefix_to_add}.{tail}"
        remove = self.prefix_to_remove or ""  # set whenever prefix_to_add is not
        if not tail.startswith(remove + "."):
            return None
        return f"{head}{base}{tail[len(remove) + 1:]}"

    def inverse(self) -> "PrefixChange":
        return PrefixChange(prefix_to_add=self.prefix_to_remove,
                            prefix_to_remove=self.prefix_to_add,
                            model_prefix=self.model_prefix, scope_prefix=self.scope_prefix)

    def describe(self) -> str:
        under = f" under {self.model_prefix}" if self.model_prefix else ""
        if self.prefix_to_add is not None:
            return f"add prefix {self.prefix_to_add}{under}{self._where()}"
        return f"remove prefix {self.prefix_to_remove}{under}{self._where()}"


@dataclass(frozen=True, slots=True)
class ConverterMatch:
    """A key claimed by a converter: which source, and what identifies its group."""

    source_index: int
    head: str  # key text before the match (scope prefix included)
    tail: str  # key text after the match (suffixes such as ``_scale_inv`` survive)
    match: PatternMatch


@dataclass(frozen=True, init=False)
class WeightConverter(PatternTransform):
    """Collect keys by source pattern and turn them into target keys through ops.

    Args:
        source_patterns: one pattern per input stream; ``*`` collects an indexed list.
        target_patterns: one per output stream.
        operations: ops applied in order (at least one).
        scope_prefix: only keys under this dotted path are considered.

    Example:
        Mixtral's per-expert ``w1``/``w3`` become a fused ``gate_up_proj``::

            WeightConverter([".experts.*.w1.weight", ".experts.*.w3.weight"],
                            ".experts.gate_up_proj",
                            operations=[MergeModulelist(0), Concatenate(1)])
    """

    operations: tuple[ConversionOp, ...] = ()

    def __init__(self, source_patterns: str | Sequence[str], target_patterns: str | Sequence[str],
                 operations: ConversionOp | Sequence[ConversionOp] = (), *,
                 scope_prefix: str | None = None) -> None:
        sources = _as_tuple(source_patterns, "source_patterns")
        targets = _as_tuple(target_patterns, "target_patterns")
        _set(self, scope_prefix=scope_prefix)
        ops = _as_ops(operations)
        if not ops or not all(isinstance(op, ConversionOp) for op in ops):
            raise MappingError(f"WeightConverter {sources} → {targets} needs a non-empty list "
                               f"of ConversionOp operations, got {operations!r}")
        if len(sources) > 1 and len(targets) > 1 and not any(op.many_to_many for op in ops):
            raise MappingError(f"WeightConverter {sources} → {targets} is many-to-many; only "
                               "ops that declare many_to_many allow that")
        _set(self, source_patterns=sources, target_patterns=targets, operations=ops)
        _compile(self)

    def match(self, key: str) -> ConverterMatch | None:
        found = self.first_match(key)
        if found is None:
            return None
        i, head, rest, m = found
        return ConverterMatch(i, head + rest[:m.start], rest[m.end:], m)

    def target_keys(self, cm: ConverterMatch) -> tuple[str, ...]:
        """Target keys of the group ``cm`` belongs to (``*`` left in place)."""
        return tuple(cm.head + t.expand(cm.match.groups, "*") + cm.tail for t in self._targets)

    def inverse(self) -> "WeightConverter":
        ops = tuple(op.inverse() for op in reversed(self.operations))
        return WeightConverter(_inverse_sources(self), _inverse_targets(self), ops,
                               scope_prefix=self.scope_prefix)

    def describe(self) -> str:
        ops = ", ".join(repr(op) for op in self.operations)
        return (f"convert {_join(self.source_patterns)} → {_join(self.target_patterns)} [{ops}]"
                + self._where())


def _as_ops(operations: object) -> tuple[ConversionOp, ...]:
    """The ops, or ``()`` when ``operations`` isn't one op or a list of ops."""
    if isinstance(operations, ConversionOp):
        return (operations,)
    if not isinstance(operations, Iterable):
        return ()
    ops = tuple(operations)
    return ops if all(isinstance(op, ConversionOp) for op in ops) else ()


def _set(obj: object, **values: object) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)


def _compile(transform: PatternTransform) -> None:
    sources = tuple(compile_source(p) for p in transform.source_patterns)
    targets = tuple(compile_target(p) for p in transform.target_patterns)
    need = max(t.max_group for t in targets)
    for s in sources:
        if len(s.user_groups) < need:
            raise PatternError(f"target uses \\{need} but source {s.text!r} captures only "
                               f"{counted(len(s.user_groups), 'group')}")
    _set(transform, _sources=sources, _targets=targets)


def _inverse_sources(transform: PatternTransform) -> tuple[str, ...]:
    """The inverse's sources: each target turned back into a regex."""
    if any(t.max_group for t in transform._targets) and len(transform._sources) > 1:
        raise NotInvertibleError(f"{transform.describe()}: targets with group references "
                                 "and several sources can't be inverted unambiguously")
    return tuple(target_to_source(t, transform._sources[0]) for t in transform._targets)


def _inverse_targets(transform: PatternTransform) -> tuple[str, ...]:
    """The inverse's targets: each source turned into the literal key it matched."""
    try:
        return tuple(source_to_target(p) for p in transform.source_patterns)
    except NotInvertibleError as e:
        raise NotInvertibleError(f"{transform.describe()}: {e}") from e


def _join(patterns: tuple[str, ...]) -> str:
    return patterns[0] if len(patterns) == 1 else "[" + ", ".join(patterns) + "]"


LEGACY: tuple[Renaming, ...] = (
    WeightRenaming(r"LayerNorm\.gamma$", "LayerNorm.weight"),
    WeightRenaming(r"LayerNorm\.beta$", "LayerNorm.bias"),
    WeightRenaming(r"\.weight_g$", ".parametrizations.weight.original0"),
    WeightRenaming(r"\.weight_v$", ".parametrizations.weight.original1"),
    WeightRenaming(r"^model\.language_model\.model\.", "model.language_model."),
    WeightRenaming(r"^language_model\.model\.model\.", "model.language_model."),
)
"""Renamings that always apply, after the mapping's, as transformers' ``legacy`` mapping:
TF-era ``LayerNorm.gamma`` / ``.beta``; torch's old ``weight_norm`` (``weight_g`` /
``weight_v``) into its parametrization; the doubled ``.model.model`` under the language
model that transformers 5.10-5.23 saved (its #45534)."""


def with_legacy(transforms: tuple[WeightTransform, ...]) -> tuple[WeightTransform, ...]:
    """What a load applies: ``transforms``, then the :data:`LEGACY` renamings they lack."""
    return transforms + tuple(t for t in LEGACY if t not in transforms)
