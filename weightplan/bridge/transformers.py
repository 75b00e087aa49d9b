"""transformers' registered conversion mappings, translated into weightplan transforms.

For a transformers model whose family weightplan has no built-in mapping for, the
depth-first lookup (:mod:`weightplan.planner.keys.lookup`) asks :class:`TransformersFinder`;
it fetches transformers' own list for the class name or ``model_type`` and translates
it by type: ``WeightRenaming``, ``PrefixChange`` and ``WeightConverter`` with the ops
``Chunk``, ``Split``, ``Concatenate``, ``MergeModulelist``, ``SplitModulelist``,
``Transpose`` (with ``check_dims``: :class:`~weightplan.bridge.ops.TransposeToFit`),
``PermuteForRope``, ``Conv3dToLinear``, ``LinearToConv3d``. Anything else
(stateful renamings, ops weightplan does not have yet, options such as
``num_shards_attribute``) is left out *and reported*: the plan lists it as a problem
naming the family and the op, and the keys it would have converted show up as
unexpected / missing instead of being silently dropped.

transformers is imported only inside these functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from enum import Enum

from torch import nn

from weightplan.bridge.dialect import source_pattern, target_pattern, with_group
from weightplan.bridge.ops import TransposeToFit
from weightplan.errors import MappingError
from weightplan.planner.core import ops as wops
from weightplan.planner.keys.lookup import Found, is_submodel, is_transformers_class
from weightplan.planner.keys.registry import Source
from weightplan.planner.keys.transforms import (
    PrefixChange, WeightConverter, WeightRenaming, WeightTransform,
)


class Coverage(Enum):
    """How much of one transformers mapping weightplan can run."""

    FULL = "full"
    PARTIAL = "partial"
    NONE = "none"


@dataclass(frozen=True)
class Translation:
    """transformers' mapping for one class name or ``model_type``, in weightplan terms."""

    family: str  # the identifier looked up
    key: str  # the transformers key it is an alias of (itself when not an alias)
    transforms: tuple[WeightTransform, ...]
    problems: tuple[str, ...]  # one line per transform that could not be translated
    gaps: tuple[str, ...]  # what each problem lacks: an op or transform type name
    total: int  # transforms in transformers' list

    @property
    def coverage(self) -> Coverage:
        if not self.problems:
            return Coverage.FULL
        return Coverage.PARTIAL if len(self.problems) < self.total else Coverage.NONE


class Untranslatable(Exception):
    """Internal: one transform or op has no weightplan equivalent (message says why)."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name  # the op or transform type weightplan lacks


class TransformersFinder:
    """The bridge as a lookup :data:`~weightplan.planner.keys.lookup.Finder`.

    As in transformers, only sub-models (``PreTrainedModel``s) are looked up, and only
    transformers' own classes (or names a user registered with transformers): custom
    code is skipped. Translations are cached per finder, i.e. per ``explain`` call.
    """

    def __init__(self) -> None:
        self._seen: dict[str, Translation | None] = {}

    def __call__(self, module: nn.Module, identifier: str) -> Found | None:
        if not is_submodel(module):  # transformers looks up PreTrainedModels only
            return None
        if not is_transformers_class(module) and identifier not in _user_registered():
            return None
        if identifier not in self._seen:
            self._seen[identifier] = translate_mapping(identifier)
        found = self._seen[identifier]
        if found is None:
            return None
        return Found(found.key, found.transforms, Source.TRANSFORMERS, found.problems)


def translate_mapping(identifier: str) -> Translation | None:
    """transformers' mapping for ``identifier`` translated, or ``None`` when it has none."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    original = get_checkpoint_conversion_mapping(identifier)
    if original is None:
        return None
    transforms, problems, gaps = [], [], []
    for t in original:
        try:
            transforms.append(translate_transform(t))
        except Untranslatable as e:
            problems.append(f"transformers mapping {identifier!r}: {e}; left out")
            gaps.append(e.name)
    return Translation(identifier, _alias_of(identifier, original), tuple(transforms),
                       tuple(problems), tuple(gaps), len(original))


def translate_transform(t: Any) -> WeightTransform:
    """One transformers transform as a weightplan transform.

    Raises:
        Untranslatable: the transform's type, an op or a pattern has no equivalent.
    """
    from transformers import core_model_loading as tf

    kind = type(t)
    if kind is tf.PrefixChange:
        return PrefixChange(prefix_to_add=t.prefix_to_add, prefix_to_remove=t.prefix_to_remove,
                            model_prefix=t.model_prefix or None)
    if kind not in (tf.WeightRenaming, tf.WeightConverter):
        raise Untranslatable(f"{kind.__name__} {_patterns(t)} has no weightplan equivalent "
                             "(its renaming depends on state or code weightplan can't read)",
                             kind.__name__)
    sources, targets = _translated_patterns(t)
    try:
        if kind is tf.WeightRenaming:
            ordered = sorted(sources, key=len, reverse=True)  # transformers: longest first
            return WeightRenaming(ordered, targets[0])
        operations = [op for o in t.operations for op in translate_op(o)]
        return WeightConverter(sources, targets, operations)
    except MappingError as e:
        raise Untranslatable(f"{kind.__name__} {_patterns(t)}: {e}", kind.__name__) from e


def _translated_patterns(t: Any) -> tuple[list[str], list[str]]:
    try:
        pairs = [target_pattern(p) for p in t._original_target_patterns]
        captured = next((c for _, c in pairs if c is not None), None)
        sources = [source_pattern(with_group(p, captured)) for p in t._original_source_patterns]
    except MappingError as e:
        raise Untranslatable(f"{type(t).__name__} {_patterns(t)}: {e}", "pattern") from e
    return sources, [p for p, _ in pairs]


def translate_op(op: Any) -> list[wops.ConversionOp]:
    """One transformers op as weightplan ops (by type and attributes).

    Raises:
        Untranslatable: weightplan has no such op, or not with these options.
    """
    name = type(op).__name__
    if name in ("Chunk", "Concatenate") and getattr(op, "num_shards_attribute", None):
        raise Untranslatable(f"op {name}(num_shards_attribute={op.num_shards_attribute!r}) "
                             "(a piece count read from the config) is not supported yet",
                             f"{name}(num_shards_attribute)")
    if name == "Transpose" and getattr(op, "check_dims", False):
        return [TransposeToFit(op.dim0, op.dim1)]
    simple = {
        "Chunk": lambda: wops.Chunk(op.dim),
        "Split": lambda: wops.Chunk(op.dim),  # weightplan's Chunk sizes pieces by target
        "Concatenate": lambda: wops.Concatenate(op.dim),
        "MergeModulelist": lambda: wops.MergeModulelist(op.dim),
        "SplitModulelist": lambda: wops.SplitModulelist(op.dim),
        "Transpose": lambda: wops.Transpose(op.dim0, op.dim1),
        "PermuteForRope": lambda: _permute_for_rope(op),
        "Conv3dToLinear": lambda: wops.Conv3dToLinear(op.in_channels, op.kernel_size),
        "LinearToConv3d": lambda: wops.LinearToConv3d(op.in_channels, op.kernel_size),
    }
    if name not in simple or type(op).__module__ != "transformers.core_model_loading":
        raise Untranslatable(f"op {name} has no weightplan equivalent yet", name)
    return [simple[name]()]


def _permute_for_rope(op: Any) -> wops.PermuteForRope:
    names = op.permute_layer_names
    return wops.PermuteForRope(config_key=op.subconfig_key,
                               names=None if names is None else tuple(names),
                               reverse=bool(op.inverse))


def _patterns(t: Any) -> str:
    src = list(t._original_source_patterns)
    tgt = list(t._original_target_patterns)
    return f"{src} → {tgt}"


def _alias_of(identifier: str, original: list) -> str:
    from transformers.conversion_mapping import (
        _MODEL_TO_CONVERSION_PATTERN, get_checkpoint_conversion_mapping,
    )

    base = _MODEL_TO_CONVERSION_PATTERN.get(identifier)
    if base is None:
        return identifier
    same = repr(get_checkpoint_conversion_mapping(base)) == repr(original)
    return base if same else identifier


def _user_registered() -> set[str]:
    from transformers.conversion_mapping import USER_REGISTERED_MAPPINGS

    return set(USER_REGISTERED_MAPPINGS)


def registered_keys() -> list[str]:
    """Every class name and ``model_type`` transformers has a conversion mapping for."""
    from transformers import conversion_mapping as cm

    cm.get_checkpoint_conversion_mapping("legacy")  # builds transformers' cache
    cache = getattr(cm, "_checkpoint_conversion_mapping_cache", None)
    if cache is None:
        cache = cm._build_checkpoint_conversion_mapping()
    return sorted(cache)


def translate_all() -> Iterator[Translation]:
    """:func:`translate_mapping` for every key transformers registers."""
    for key in registered_keys():
        translation = translate_mapping(key)
        if translation is not None:
            yield translation
