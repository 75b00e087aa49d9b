"""An adapter's keys, mapped onto a model with the adapter injected.

peft saves ``base_model.model.<base key path>.lora_A.weight``; the injected model holds
``<prefix><base path>.lora_A.<adapter name>.weight``. The base model's own renames apply
to adapter keys as they are. Each fused-experts converter of the base mapping (per-expert
``gate``/``up`` → ``gate_up_proj``, ``down`` → ``down_proj``) becomes two adapter
converters, one per LoRA factor, in peft's packing of a wrapped parameter:

* fused pair, ``lora_A``: ``MergeModulelist(0)`` → ``Concatenate(1)`` (rank axis) →
  ``Flatten(0, 1)``: ``(E·2r, in)``, expert axis slowest;
* fused pair, ``lora_B``: ``MergeModulelist(0)`` → ``BlockDiagonal`` → ``Permute(1, 2, 0)``
  → ``Flatten(1, 2)``: ``(2·out, 2r·E)``, expert axis fastest (column ``k·E + e``);
* one parameter (``down_proj``): the same without the concatenation / block diagonal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from weightplan.errors import AdapterError
from weightplan.planner.core.ops import (
    BlockDiagonal, Concatenate, ConversionOp, Flatten, MergeModulelist, Permute,
)
from weightplan.planner.inputs.adapter_model import PEFT_PREFIX, InjectedAdapter
from weightplan.planner.keys.transforms import (
    Renaming, WeightConverter, WeightRenaming, WeightTransform,
)

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_WEIGHT = re.compile(r"\\?\.weight\$?$")


@dataclass(frozen=True)
class FusedTarget:
    """A base converter fusing per-expert linears, as the adapter converts it."""

    sources: tuple[str, ...]  # the base converter's source patterns (one per fused linear)
    module: str  # the target pattern's module part (``.experts``)
    parameter: str  # the fused parameter's name (``gate_up_proj``)
    wrapper: str | None  # the wrapper path suffix in the model (None: the model has no LoRA)
    scope: str | None

    @property
    def pair(self) -> bool:
        return len(self.sources) > 1

    @property
    def linears(self) -> tuple[str, ...]:
        """The per-expert linears' names (``w1``, ``w3``)."""
        return tuple(_WEIGHT.sub("", s).rsplit(".", 1)[-1] for s in self.sources)


def adapter_transforms(base: Iterable[WeightTransform], injected: InjectedAdapter,
                       modules_to_save: tuple[str, ...] = ()
                       ) -> tuple[tuple[WeightTransform, ...], tuple[FusedTarget, ...]]:
    """The transforms that load an adapter's file into ``injected``'s tensors, and the
    fused-experts conversions among them.

    Raises:
        AdapterError: an adapter name weightplan can't put in a key pattern.
    """
    name = injected.name
    if not _NAME.fullmatch(name):
        raise AdapterError(f"adapter name {name!r}: use letters, digits, '_' or '-'")
    base = tuple(base)
    out: list[WeightTransform] = []
    if not injected.prefix:  # a model with adapters injected in place: no PeftModel level
        out.append(WeightRenaming(rf"^{re.escape(PEFT_PREFIX)}", ""))
    out += [t for t in base if isinstance(t, Renaming)]
    out += name_renames(name, modules_to_save)
    fused = fused_targets(base, injected)
    for target in fused:
        out += _fused_converters(target, name)
    return tuple(out), fused


def name_renames(name: str, modules_to_save: tuple[str, ...] = ()) -> list[WeightRenaming]:
    """peft's saved names → the injected ones: the adapter name goes in."""
    renames = [
        WeightRenaming(r"\.(lora_A|lora_B)\.(weight|bias)$", rf".\1.{name}.\2"),
        WeightRenaming(r"\.lora_magnitude_vector$", f".lora_magnitude_vector.{name}.weight"),
        WeightRenaming(r"\.(lora_embedding_A|lora_embedding_B)$", rf".\1.{name}"),
    ]
    if modules_to_save:
        alternatives = "|".join(re.escape(m) for m in modules_to_save)
        renames.append(WeightRenaming(rf"((?:^|\.)(?:{alternatives}))\.(weight|bias)$",
                                      rf"\1.modules_to_save.{name}.\2"))
    return renames


def fused_targets(base: Iterable[WeightTransform], injected: InjectedAdapter | None = None
                  ) -> tuple[FusedTarget, ...]:
    """The base mapping's converters fusing per-expert linears (with the wrapper path each
    fused parameter has in ``injected``, when given)."""
    return tuple(_fused(base, injected))


def _fused(base: Iterable[WeightTransform], injected: InjectedAdapter | None
           ) -> Iterable[FusedTarget]:
    for t in base:
        if not isinstance(t, WeightConverter) or len(t.target_patterns) != 1:
            continue
        kinds = [type(op) for op in t.operations]
        pair = kinds == [MergeModulelist, Concatenate] and len(t.source_patterns) == 2
        one = kinds == [MergeModulelist] and len(t.source_patterns) == 1
        if not (pair or one) or not all(_WEIGHT.search(s) for s in t.source_patterns):
            continue
        module, _, parameter = t.target_patterns[0].rpartition(".")
        wrapper = None if injected is None else _wrapper(injected, parameter)
        yield FusedTarget(t.source_patterns, module, parameter, wrapper, t.scope_prefix)


def _wrapper(injected: InjectedAdapter, parameter: str) -> str | None:
    """The wrapper's path below the experts module (``""`` or ``".base_layer"``...), when
    every layer wrapping ``parameter`` agrees."""
    suffixes = {layer.path[len(layer.target) - len(parameter) - 1:]
                for layer in injected.layers.values() if layer.parameter == parameter}
    return suffixes.pop() if len(suffixes) == 1 else None


def _fused_converters(target: FusedTarget, name: str) -> list[WeightConverter]:
    if target.wrapper is None:
        return []
    converters = []
    for factor in ("lora_A", "lora_B"):
        sources = [_WEIGHT.sub(rf".{factor}.{name}.weight", s) for s in target.sources]
        ops = _ops(factor, target.pair)
        converters.append(WeightConverter(sources, f"{target.module}{target.wrapper}.{factor}."
                                          f"{name}.weight", ops, scope_prefix=target.scope))
    return converters


def _ops(factor: str, pair: bool) -> list[ConversionOp]:
    if factor == "lora_A":
        return [MergeModulelist(0), *([Concatenate(1)] if pair else []), Flatten(0, 1)]
    return [MergeModulelist(0), *([BlockDiagonal()] if pair else []), Permute((1, 2, 0)),
            Flatten(1, 2)]
