"""``explain_merged_load``: a base checkpoint with a LoRA adapter folded into its weights, in
one plan, into the plain base model (no LoRA layers: what is served and saved).

The keys are routed as for a load into the model with the adapter injected (a copy on
meta tells where peft puts each factor and its scale); then each adapted weight's group
takes its ``lora_A`` and ``lora_B`` groups in: one :class:`MergeLora` node whose inputs
are the base weight's reads (its own layout chain: fused experts) and the factors' reads
(peft's packing), computed in float32, cast once to the model's dtype (through FP8
dequantize where the base is FP8). A ``modules_to_save`` copy replaces its base module.
The load record keeps each merged weight as its base conversion, so ``weightplan.save``
writes the merged model in the base checkpoint's layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from weightplan.errors import AdapterError, ParallelError
from weightplan.planner.core.ops.merge import MergeLora, TakeTrained
from weightplan.planner.core.problems import Note
from weightplan.planner.inputs.adapter import Adapter
from weightplan.planner.inputs.adapter_model import InjectedAdapter, LoraLayer, inspect_adapter
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.keys.adapter_keys import adapter_transforms, path_alternatives
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.routing import Group, Routing
from weightplan.planner.keys.transforms import WeightConverter, WeightRenaming
from weightplan.planner.pipelines.adapter_load import (
    adapter_first, base_and_adapter, last_file_keys, with_adapter,
)
from weightplan.planner.pipelines.adapter_summary import Replacement
from weightplan.planner.pipelines.load import explain_load
from weightplan.planner.pipelines.plan import LoadPlanData


def explain_merged_load(model: torch.nn.Module, injected_model: torch.nn.Module,
                        base_checkpoint: Checkpoint, adapter: Adapter, base: MappingChoice, *,
                        name: str = "default", **options: Any) -> LoadPlanData:
    """One plan loading ``base_checkpoint``'s files into ``model`` with ``adapter`` merged in;
    ``injected_model``: a copy of ``model`` with the adapter ``name`` injected (on meta).

    Raises:
        AdapterError: DoRA, LoRA biases, trainable tokens or layer_replication (not
            merged here), a factor
            without its pair, or an adapted weight that several outputs of one converter
            share.
        ParallelError: ``tp=``.
    """
    if options.get("tp") is not None:
        raise ParallelError(f"{adapter.directory}: tp= with an adapter is not supported yet")
    config = adapter.config
    _refuse_unmergeable(adapter)
    injected = inspect_adapter(injected_model, name)
    transforms, fused = adapter_transforms(base.transforms, injected, config.modules_to_save)
    transforms += (*_unwrapped(injected),
                   *(t for t in base.transforms if isinstance(t, WeightConverter)))
    choice = MappingChoice(base.key, base.reason, transforms, base.submodules)
    notes: list[Note] = []
    checkpoint = base_and_adapter(base_checkpoint, adapter)
    keys = last_file_keys(checkpoint)
    replaced: dict[str, Replacement] = {}
    renamed: dict[str, str] = {}
    untied = _untie_copies(model, injected)
    data = explain_load(model, checkpoint, mapping=choice,
                        regroup=lambda r: merged_routing(
                            adapter_first(r, frozenset(keys), injected, replaced),
                            injected, notes, untied, replaced, renamed), **options)
    data = with_adapter(data, adapter, injected, fused, keys=keys,
                        replaced=tuple(replaced.values()))
    assert data.adapter is not None
    merged = sum(1 for c in data.conversions if c.loads and len(c.ops) == 1
                 and isinstance(c.ops[0], MergeLora))
    findings = dataclasses.replace(data.findings, notes=data.findings.notes + tuple(notes))
    adapter_part = dataclasses.replace(data.adapter, merged=merged,
                                       renamed=tuple(sorted(renamed.items())))
    return dataclasses.replace(data, adapter=adapter_part, findings=findings)



def _refuse_unmergeable(adapter: Adapter) -> None:
    """Raises:
        AdapterError: what a merge of LoRA factors can't fold (naming the config field).
    """
    config = adapter.config
    if config.use_dora or str(config.raw.get("lora_bias", False)).lower() == "true":
        raise AdapterError(f"{adapter.config.file}: merge=True folds plain LoRA (W + s·B·A); "
                           "DoRA and LoRA biases are not merged by weightplan: load without "
                           "merge=True")
    if config.raw.get("trainable_token_indices"):
        raise AdapterError(f"{adapter.config.file}: trainable_token_indices: merge=True folds "
                           "LoRA factors; trainable tokens (rows that replace the "
                           "embedding's) are not merged by weightplan: load without merge=True")
    if config.raw.get("layer_replication"):
        raise AdapterError(f"{adapter.config.file}: layer_replication: the replicated layers "
                           "share their base weights, each with its own LoRA, so no merged "
                           "weight serves them all; load without merge=True")


def _unwrapped(injected: InjectedAdapter) -> tuple[WeightRenaming, ...]:
    """A base layer the adapter's file holds (an embedding peft saved with it) → the plain
    model's tensor, which the adapter's then replaces (:func:`adapter_first`). The wrapped
    paths as patterns over their layer numbers where that is exact
    (:func:`~weightplan.planner.keys.adapter_keys.path_alternatives`): every key is asked
    this renaming, and a literal path per layer made the whole checkpoint route key by key
    (the merged load planned in ~0.1 s more than the unmerged one, 20 layers)."""
    plain = [x.path for x in injected.layers.values() if x.parameter is None]
    if not plain:
        return ()
    alternatives = path_alternatives(plain, injected.modules)
    return (WeightRenaming(rf"^({alternatives})\.base_layer\.(weight|bias)$", r"\1.\2"),)


def _untie_copies(model: torch.nn.Module, injected: InjectedAdapter
                  ) -> dict[str, tuple[str, ...]]:
    """Untie each parameter a ``modules_to_save`` copy replaces that the model ties to
    another (lm_head and the embedding: Llama 3.2, Gemma), as peft's ``merge_and_unload``
    leaves it: each saved module's name gets a parameter of its own (the trained copy), the
    other names keep the base tensor, and the config says ``tie_word_embeddings=False``.
    Returns ``{untied name: the other names it was tied to}``."""
    saved = {m.removeprefix(injected.prefix) for m in injected.saved_modules}
    names: dict[int, tuple[torch.nn.Parameter, list[str]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (p, []))[1].append(name)
    untied: dict[str, tuple[str, ...]] = {}
    for p, group in names.values():
        copies = [n for n in group if n.rpartition(".")[0] in saved] if len(group) > 1 else []
        for name in copies:
            path, _, attr = name.rpartition(".")
            model.get_submodule(path)._parameters[attr] = torch.nn.Parameter(
                torch.empty_like(p), requires_grad=p.requires_grad)
            untied[name] = tuple(n for n in group if n != name)
    config = getattr(model, "config", None)
    if untied and config is not None and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False  # (what peft's merge sets)
    return untied


def merged_routing(routing: Routing, injected: InjectedAdapter, notes: list[Note],
                   untied: dict[str, tuple[str, ...]], replaced: dict[str, Replacement],
                   renamed: dict[str, str]) -> Routing:
    """``routing`` with each adapted weight's group and its factors' groups made one
    (a :class:`MergeLora` op), and each ``modules_to_save`` copy in its base's place. A base
    untied from the names that keep its tensor (``untied``, :func:`_untie_copies`): a copy
    of a name the checkpoints lack (lm_head) loads alone (noted in ``replaced``: a save
    writes it under the base's name); a copy of the name they hold (the embedding) loads
    alone too, and the checkpoint's key goes to the name that keeps the tensor (lm_head:
    each noted in ``renamed``, the checkpoint key → the key a save writes it as)."""
    index = {g.output_key(0, 0): i for i, g in enumerate(routing.groups)
             if len(g.targets) == 1 and "*" not in g.targets[0]}
    groups: list[Group | None] = list(routing.groups)
    for layer in injected.layers.values():
        found = _factors(index, layer, injected.name)
        if found is None:
            continue
        w, a, b = found
        gw, ga, gb = routing.groups[w], routing.groups[a], routing.groups[b]
        op = MergeLora(layer.scaling, (len(gw.sources), len(ga.sources), len(gb.sources)),
                       gw.ops, ga.ops, gb.ops, layer.experts, layer.transposed)
        groups[w] = _joined(gw, (ga, gb), op)
        groups[a] = groups[b] = None
    marker = f".modules_to_save.{injected.name}."
    for key, i in index.items():
        if marker in key:
            _place_copy(routing.groups, groups, index, (i, key.replace(marker, ".")),
                        untied, replaced, renamed, notes)
    return dataclasses.replace(routing, groups=tuple(g for g in groups if g is not None))


def _place_copy(found: tuple[Group, ...], groups: list[Group | None], index: dict[str, int],
                copy: tuple[int, str], untied: dict[str, tuple[str, ...]],
                replaced: dict[str, Replacement], renamed: dict[str, str],
                notes: list[Note]) -> None:
    """The ``modules_to_save`` copy ``copy`` (its group, the model tensor it replaces) put
    in its base's place in ``groups`` (see :func:`merged_routing`)."""
    i, to = copy
    base, gs = index.get(to), found[i]
    keeps = [n for n in untied.get(to, ()) if n not in untied and n not in index]
    if base is not None and keeps and len(found[base].entries) == 1 == len(gs.entries):
        gb, source = found[base], found[base].entries[0].key  # (the embedding's copy)
        groups[base], groups[i] = _retargeted(gb, keeps[0]), _retargeted(gs, to)
        renamed.update({source: keeps[0], gs.entries[0].key: source})
        notes.append(_untied_note(to, untied[to]))
        notes.append(Note(keeps[0], f"{keeps[0]} untied from {to}: keeps the base tensor, "
                          f"loaded from the base checkpoint's {source} (a save writes it as "
                          f"{keeps[0]})"))
    elif base is None and to in untied:  # (lm_head's copy)
        groups[i] = _retargeted(gs, to)
        replaced[to] = Replacement(to, ", ".join(e.key for e in gs.entries), to)
        notes.append(_untied_note(to, untied[to]))
    elif base is not None:
        gw = found[base]
        groups[base] = _joined(gw, (gs,), TakeTrained((len(gw.sources), len(gs.sources)),
                                                   gw.ops, gs.ops))
        groups[i] = None
        notes.append(Note(to, f"{to} replaced by the adapter's trained copy (modules_to_save);"
                          " the base checkpoint's tensor is read and dropped"))


def _untied_note(name: str, others: tuple[str, ...]) -> Note:
    return Note(name, f"{name} untied from {', '.join(others)} and loaded from the adapter's "
                "trained copy (modules_to_save), as peft's merge_and_unload leaves it "
                "(config.tie_word_embeddings=False)")


def _retargeted(group: Group, to: str) -> Group:
    """``group`` loading its one output into the model tensor ``to``."""
    return Group(None, group.sources, group.routes, (to,), ((to,),), (), group.ops)


def _factors(index: dict[str, int], layer: LoraLayer, name: str
             ) -> tuple[int, int, int] | None:
    """The groups of ``layer``'s base weight, ``lora_A`` and ``lora_B``; ``None`` when the
    file has neither factor (the base loads as it is).

    Raises:
        AdapterError: one factor without the other, or no base weight to merge into.
    """
    base = layer.target if layer.parameter else f"{layer.target}.weight"
    found = [index.get(f"{layer.path}.lora_{f}.{name}.weight",
                       index.get(f"{layer.path}.lora_embedding_{f}.{name}")) for f in "AB"]
    if found == [None, None]:
        return None
    if None in found or base not in index:
        missing = base if base not in index else f"lora_{'AB'[found.index(None)]}"
        raise AdapterError(f"merging the adapter into {base}: {missing} is not in the "
                           "checkpoints (or is one of several outputs of a converter), so "
                           "the merged weight can't be computed")
    a, b = found
    assert a is not None and b is not None
    return index[base], a, b


def _joined(base: Group, others: tuple[Group, ...], op: object) -> Group:
    """One group: the base group's sources, then each other group's, through ``op``."""
    key = base.output_key(0, 0)
    sources, routes = base.sources, base.routes
    for g in others:
        sources, routes = sources + g.sources, routes + g.routes
    return Group(None, sources, routes, (key,), ((key,),), (), (op,))  # type: ignore[arg-type]
