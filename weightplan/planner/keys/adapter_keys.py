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
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from weightplan.errors import AdapterError
from weightplan.planner.core.ops import (
    BlockDiagonal, Concatenate, ConversionOp, Flatten, MergeModulelist, Permute,
)
from weightplan.planner.inputs.adapter_model import PEFT_PREFIX, TOKEN_ADAPTER, InjectedAdapter
from weightplan.planner.keys.templates import template_of
from weightplan.planner.keys.transforms import (
    Renaming, WeightConverter, WeightRenaming, WeightTransform,
)

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_LEADING_ZERO = re.compile(r"(?<![^.])0(?=[0-9])")
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
    out: list[WeightTransform] = list(_saved_renames(name, modules_to_save))
    if not injected.prefix:  # a model with adapters injected in place: no PeftModel level
        out.append(WeightRenaming(rf"^{re.escape(PEFT_PREFIX)}", ""))
    out += [t for t in base if isinstance(t, Renaming)]
    out += name_renames(name)
    fused = fused_targets(base, injected)
    for target in fused:
        out += _fused_converters(target, name)
    return tuple(out), fused


def _saved_renames(name: str, modules_to_save: tuple[str, ...]) -> list[WeightRenaming]:
    """The adapter's trained copies of whole modules → ``modules_to_save.<name>``; scoped
    to peft's prefix, which only the adapter's keys carry (a base checkpoint's
    ``lm_head.weight`` is the original module's)."""
    if not modules_to_save:
        return []
    alternatives = "|".join(re.escape(m) for m in modules_to_save)
    return [WeightRenaming(rf"((?:^|\.)(?:{alternatives}))\.(weight|bias)$",
                           rf"\1.modules_to_save.{name}.\2", scope_prefix=PEFT_PREFIX[:-1])]


def name_renames(name: str) -> list[WeightRenaming]:
    """peft's saved names → the injected ones: the adapter name goes in."""
    return [
        WeightRenaming(r"\.(lora_A|lora_B)\.(weight|bias)$", rf".\1.{name}.\2"),
        WeightRenaming(r"\.lora_magnitude_vector$", f".lora_magnitude_vector.{name}.weight"),
        WeightRenaming(r"\.(lora_embedding_A|lora_embedding_B)$", rf".\1.{name}"),
        WeightRenaming(r"\.token_adapter\.trainable_tokens_delta$",
                       f".token_adapter.trainable_tokens_delta.{name}"),
    ]


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


def _fused_converters(target: FusedTarget, name: str,
                      packed: tuple[int, int] | None = None) -> list[WeightConverter]:
    """The two factors' converters; ``packed``: (experts, model rank), pinning the sizes
    that their inverses (a save in the per-expert layout) need."""
    if target.wrapper is None:
        return []
    converters = []
    for factor in ("lora_A", "lora_B"):
        sources = [_WEIGHT.sub(rf".{factor}.{name}.weight", s) for s in target.sources]
        ops = _ops(factor, target.pair, packed)
        converters.append(WeightConverter(sources, f"{target.module}{target.wrapper}.{factor}."
                                          f"{name}.weight", ops, scope_prefix=target.scope))
    return converters


def _ops(factor: str, pair: bool, packed: tuple[int, int] | None = None) -> list[ConversionOp]:
    if factor == "lora_A":
        return [MergeModulelist(0), *([Concatenate(1)] if pair else []),
                Flatten(0, 1, sizes=packed)]
    return [MergeModulelist(0), *([BlockDiagonal()] if pair else []), Permute((1, 2, 0)),
            Flatten(1, 2, sizes=None if packed is None else packed[::-1])]


def layout_transforms(base: Iterable[WeightTransform], injected: InjectedAdapter,
                      per_expert: bool, modules_to_save: tuple[str, ...] = ()
                      ) -> tuple[WeightTransform, ...]:
    """The transforms whose inverse writes ``injected``'s tensors as an adapter file: in the
    per-expert layout (the base's per-expert names, each fused factor unpacked; sizes
    pinned from the model), or in the fused one (the model's names, as peft saves them).
    The names they take carry peft's ``base_model.model.`` prefix already.

    Raises:
        AdapterError: a fused parameter whose layers differ in experts or rank.
    """
    base = tuple(base)
    out: list[WeightTransform] = list(_saved_renames(injected.name, modules_to_save))
    if per_expert:
        out += [t for t in base if isinstance(t, Renaming)]
    out += name_renames(injected.name)
    for target in fused_targets(base, injected) if per_expert else ():
        packed = {(x.experts, x.r) for x in injected.layers.values()
                  if x.parameter == target.parameter}
        if len(packed) > 1:
            raise AdapterError(f"the layers adapting {target.parameter} differ in experts or "
                               f"rank ({sorted(packed)}): one per-expert layout can't hold them")
        out += _fused_converters(target, injected.name, packed.pop() if packed else None)
    return tuple(out)


def base_and_adapter_transforms(base: Iterable[WeightTransform], injected: InjectedAdapter,
                                modules_to_save: tuple[str, ...] = ()
                                ) -> tuple[tuple[WeightTransform, ...], tuple[FusedTarget, ...]]:
    """The transforms of one plan loading a base checkpoint *and* an adapter's file into a
    model with the adapter injected in place: the adapter's (:func:`adapter_transforms`),
    then the base keys moved where the LoRA wrappers put the base tensors
    (``q_proj.weight`` → ``q_proj.base_layer.weight``, a fused parameter one
    ``base_layer`` deeper per wrapped parameter, ``lm_head.weight`` →
    ``lm_head.original_module.weight``). The wrapped paths are written as patterns over
    their layer numbers where that is exact (:func:`path_alternatives`), so these
    renamings are routed once per key template, not key by key."""
    base = tuple(base)
    adapter, fused = adapter_transforms(base, injected, modules_to_save)
    plain = [layer.path for layer in injected.layers.values() if layer.parameter is None]
    out: list[WeightTransform] = list(adapter)
    for paths, target in ((plain, r"\1.base_layer.\2"),
                          (injected.saved_modules, r"\1.original_module.\2"),
                          (token_wrappers(injected), rf"\1{TOKEN_ADAPTER}.base_layer.\2")):
        if paths:
            alternatives = path_alternatives(paths, injected.modules)
            out.append(WeightRenaming(rf"^({alternatives})\.(weight|bias)$", target))
    holders = _holders(injected)
    out += _moved_parameters(injected, holders)
    for t in base:
        if isinstance(t, WeightConverter):
            out += _relocated(t, holders)
    return tuple(out), fused


def token_wrappers(injected: InjectedAdapter) -> tuple[str, ...]:
    """The modules wrapped for trainable tokens (a tied lm_head's too: its base layer is
    the embedding's), whose base tensors move into ``token_adapter.base_layer``."""
    tail = f"{TOKEN_ADAPTER}.trainable_tokens_delta.{injected.name}"
    return tuple(sorted(n[:-len(tail)] for n in injected.parameters if n.endswith(tail)))


def path_alternatives(paths: Iterable[str], modules: Collection[str]) -> str:
    """A regex (``|``-joined alternatives, no group) matching exactly the paths ``paths``
    among ``modules`` (the model's modules, or those of a kind: the holders of a
    parameter). The paths of one key template (every number of an all-digit component
    made ``1``, lengths kept) that are *all* the modules of that template become one
    alternative, each such number ``\\d`` per digit (``model\\.layers\\.\\d\\d\\.mlp``: the
    same rename holds for every such layer, so the renaming routes once per key
    template); the paths of a template with more modules (an adapter on some layers
    only) stay literal, and route key by key."""
    wanted: dict[str | None, set[str]] = {}
    for path in paths:
        wanted.setdefault(template_of(path), set()).add(path)
    universe = set(modules)
    # (a module numbered with a leading zero, ``h.01``, has no template but a ``\\d\\d``
    # pattern matches it: counted with the modules whose numbers have its lengths)
    counts = Counter(template_of(m) or template_of(_LEADING_ZERO.sub("1", m)) for m in universe)
    alternatives: list[str] = []
    for template, members in sorted(wanted.items(), key=lambda item: str(item[0])):
        if template is not None and counts[template] == len(members) and members <= universe:
            alternatives.append(r"\.".join(r"\d" * len(c) if c.isascii() and c.isdigit()
                                            else re.escape(c)
                                            for c in template.split(".")))
        else:
            alternatives += (re.escape(p) for p in sorted(members))
    return "|".join(alternatives)


def _holders(injected: InjectedAdapter) -> dict[str, dict[str, int]]:
    """Each parameter name → the modules holding one (``base_layer`` wrappers left out of
    their paths) → how many wrappers nest around it there."""
    held: dict[str, dict[str, int]] = {}
    for name in injected.parameters:
        module, _, last = name.rpartition(".")
        owner = module
        while owner.endswith(_BASE):
            owner = owner[:-len(_BASE)]
        held.setdefault(last, {})[owner] = (len(module) - len(owner)) // len(_BASE)
    return held


_BASE = ".base_layer"


def _by_depth(held: dict[str, int]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for owner, depth in held.items():
        if depth:
            out.setdefault(depth, set()).add(owner)
    return out


def _moved_parameters(injected: InjectedAdapter, holders: dict[str, dict[str, int]]
                      ) -> list[WeightRenaming]:
    """A parameter of a module whose parameters are wrapped, saved as it is
    (``experts.gate_up_proj``, ``experts.down_proj``) → where it sits in the model, below
    every wrapper of its module (one renaming per parameter and depth)."""
    wrapped = {x.target[:-len(x.parameter) - 1] for x in injected.layers.values()
               if x.parameter is not None}
    out = []
    for parameter, held in sorted(holders.items()):
        moved = {o: d for o, d in held.items() if d and o in wrapped}
        out += [WeightRenaming(rf"^({path_alternatives(owners, held)})\.{re.escape(parameter)}$",
                               rf"\1{_BASE * depth}.{parameter}")
                for depth, owners in sorted(_by_depth(moved).items())]
    return out


def _relocated(converter: WeightConverter, holders: dict[str, dict[str, int]]
               ) -> list[WeightConverter]:
    """A base converter whose fused output is wrapped, its target moved to the inner module.
    Where the model's holders of that parameter sit at one depth, one converter; where they
    differ (an adapter wrapping the experts of some layers only, or deeper on some), one per
    depth, its sources anchored to those holders' paths, then the converter as it is. A
    scoped converter counts the holders in its scope, by their paths below it (what its
    sources are searched in)."""
    if len(converter.target_patterns) != 1:
        return [converter]
    module, _, parameter = converter.target_patterns[0].rpartition(".")
    held = holders.get(parameter, {})
    if converter.scope_prefix:
        head = converter.scope_prefix + "."
        held = {o[len(head):]: d for o, d in held.items() if o.startswith(head)}
    depths = set(held.values())
    if depths == {0} or not depths:
        return [converter]
    if len(depths) == 1:
        return [WeightConverter(converter.source_patterns, f"{module}{_BASE * depths.pop()}."
                                f"{parameter}", converter.operations,
                                scope_prefix=converter.scope_prefix)]
    anchored = any(s.startswith("^") for s in converter.source_patterns)
    if anchored or not _MODULE.fullmatch(module) or any(
            not o.endswith(module) for o, d in held.items() if d):
        return [converter]  # (a converter this can't anchor: left where the base puts it)
    out, every = [], {o[:-len(module)] for o in held if o.endswith(module)}
    for depth, owners in sorted(_by_depth(held).items()):
        heads = path_alternatives([o[:-len(module)] for o in owners], every)
        out.append(WeightConverter([f"^({heads}){s}" for s in converter.source_patterns],
                                   rf"\1{module}{_BASE * depth}.{parameter}",
                                   converter.operations, scope_prefix=converter.scope_prefix))
    return [*out, converter]


# (``.experts`` as mixtral writes it, or ``mlp.experts`` as qwen2_moe does: the head before
# it, ``model.layers.1.`` then, ends in the dot)
_MODULE = re.compile(r"\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
