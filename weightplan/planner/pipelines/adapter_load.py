"""``explain_adapter_load``: an adapter's file planned into a model with the adapter injected.

The base mapping is looked up as for any load; :mod:`~weightplan.planner.keys.adapter_keys`
derives the adapter's transforms from it; only the adapter's tensors of the model are
planned (the base is left alone). Then the adapter's findings: its tensors with no place
(an adapter silently loading nothing is the classic failure, so none landing at all
raises), one half of a fused pair, scales the model changed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

import torch

from weightplan.errors import AdapterError, ParallelError
from weightplan.planner.core.problems import Note, Problem, ProblemKind
from weightplan.planner.inputs.adapter import Adapter, AdapterConfig, scale_of
from weightplan.planner.inputs.adapter_model import (
    PEFT_PREFIX, InjectedAdapter, injected_adapters, inspect_adapter,
)
from weightplan.planner.inputs.checkpoint import Checkpoint, open_checkpoint
from weightplan.planner.inputs.model_info import keep_dtype_of, restrict_model
from weightplan.planner.keys.adapter_keys import (
    FusedTarget, adapter_transforms, base_and_adapter_transforms,
)
from weightplan.planner.keys.lookup import Finder
from weightplan.planner.keys.registry import MappingChoice
from weightplan.planner.keys.routing import Routing
from weightplan.planner.pipelines.adapter_summary import (
    AdapterSummary, LayoutConversion, Replacement, ScaleChange,
)
from weightplan.planner.pipelines.adapter_tokens import token_findings, trainable_tokens
from weightplan.planner.pipelines.load import choose_mapping, explain_load
from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.tensors.ir.build import TargetStatus
from weightplan.units import counted

_TOLERANCE = 1e-6


def explain_adapter_load(model: torch.nn.Module, adapter: Adapter, *, name: str = "default",
                         mapping: object = None, finder: Finder | None = None,
                         tp: object = None, **options: Any) -> LoadPlanData:
    """Plan loading ``adapter``'s tensors into adapter ``name`` injected in ``model``.

    Raises:
        ParallelError: ``tp=`` (adapters are not sharded yet).
        AdapterError: the model has no adapter ``name``, or none of the file's tensors has
            a place in it.
    """
    if tp is not None:
        raise ParallelError(f"{adapter.directory}: tp= with an adapter is not supported yet; "
                            "load the adapter without tp= (its tensors are small)")
    injected = _injected(model, adapter, name)
    base = choose_mapping(mapping, model, finder)
    transforms, fused = adapter_transforms(base.transforms, injected,
                                           adapter.config.modules_to_save)
    choice = MappingChoice(base.key, base.reason, transforms, base.submodules)
    checkpoint = open_checkpoint(adapter.weights)  # (read once: its keys, then the plan)
    file_keys = _model_names(checkpoint.entries, injected.prefix)
    data = explain_load(model, checkpoint, mapping=choice,
                        view=lambda info: restrict_model(
                            info, lambda n: injected.owns(n) or n in file_keys), **options)
    return with_adapter(data, adapter, injected, fused)


def explain_base_and_adapter(model: torch.nn.Module, base_checkpoint: Checkpoint,
                             adapter: Adapter, base: MappingChoice, *, name: str = "default",
                             **options: Any) -> LoadPlanData:
    """One plan (one schedule) loading a base checkpoint's files and an adapter's file into
    ``model``, the adapter ``name`` injected in it in place (no PeftModel level)."""
    if options.get("tp") is not None:
        raise ParallelError(f"{adapter.directory}: tp= with an adapter is not supported yet")
    injected = _injected(model, adapter, name)
    transforms, fused = base_and_adapter_transforms(base.transforms, injected,
                                                    adapter.config.modules_to_save)
    choice = MappingChoice(base.key, base.reason, transforms, base.submodules)
    checkpoint = base_and_adapter(base_checkpoint, adapter)
    keys = last_file_keys(checkpoint)
    replaced: dict[str, Replacement] = {}
    data = explain_load(model, checkpoint, mapping=choice,
                        view=lambda info: keep_dtype_of(info, injected.owns_factor),
                        regroup=lambda r: adapter_first(r, frozenset(keys), injected, replaced),
                        **options)
    return with_adapter(data, adapter, injected, fused, keys=keys,
                        replaced=tuple(replaced.values()))


def _injected(model: torch.nn.Module, adapter: Adapter, name: str) -> InjectedAdapter:
    """The adapter ``name`` injected in ``model``.

    Raises:
        AdapterError: the model has none of that name (naming those it has)."""
    injected = inspect_adapter(model, name)
    if not injected.layers and not injected.saved_modules and not injected.tokens:
        found = injected_adapters(model)
        raise AdapterError(f"{adapter.directory}: the model has no adapter {name!r} injected"
                           f" (adapters found: {list(found) or 'none'}); inject it with "
                           "peft (get_peft_model / inject_adapter_in_model) or use "
                           "weightplan.from_pretrained(base, adapter=...)")
    return injected


def last_file_keys(checkpoint: Checkpoint) -> tuple[str, ...]:
    """The keys of the checkpoint's last file (the adapter's), its header not read again."""
    last = checkpoint.files[-1].path
    return tuple(k for k, e in checkpoint.entries.items() if e.file == last)


def adapter_first(routing: Routing, keys: frozenset[str], injected: InjectedAdapter,
                  replaced: dict[str, Replacement]) -> Routing:
    """``routing`` without the base checkpoint's group of each model tensor that the
    adapter's file (``keys``) holds too, outside the adapter's own tensors: an embedding
    peft saved with the adapter (``save_embedding_layers``; its vocabulary may be resized).
    peft loads the adapter's over the base's, so the base's is not read; each is recorded
    in ``replaced``. Two groups of one side for one tensor stay: a real conflict, refused
    when the conversions are built."""
    sides: dict[str, tuple[list[int], list[int]]] = {}
    for i, g in enumerate(routing.groups):
        if len(g.targets) != 1 or "*" in g.targets[0]:
            continue
        ours = {e.key in keys for e in g.entries}
        if len(ours) == 1:
            sides.setdefault(g.output_key(0, 0), ([], []))[0 if True in ours else 1].append(i)
    dropped = set()
    for key, (mine, base) in sides.items():
        if len(mine) == 1 and len(base) == 1 and not injected.owns(key):
            kept, gone = routing.groups[mine[0]], routing.groups[base[0]]
            replaced[key] = Replacement(key, ", ".join(e.key for e in kept.entries),
                                        ", ".join(e.key for e in gone.entries))
            dropped.add(base[0])
    if not dropped:
        return routing
    return dataclasses.replace(routing, groups=tuple(
        g for i, g in enumerate(routing.groups) if i not in dropped))


def base_and_adapter(base: Checkpoint, adapter: Adapter) -> Checkpoint:
    """The base checkpoint's files and the adapter's file, read as one checkpoint, named
    for the plan's header by both: ``base/ + adapter lora/``; the base directory's files
    it doesn't read (:attr:`Checkpoint.left_out`) noted by their paths (but the adapter's
    file, where the base's directory holds it: read as the adapter)."""
    files = [f.path for f in base.files]
    checkpoint = open_checkpoint([*files, adapter.weights])
    parents = {os.path.dirname(f) for f in files}
    where = parents.pop() if len(parents) == 1 else counted(len(files), "base file")
    paths = ((os.path.join(os.path.dirname(files[0]), name), why) for name, why in base.left_out)
    left_out = tuple((path, why) for path, why in paths
                     if os.path.realpath(path) != os.path.realpath(adapter.weights))
    return dataclasses.replace(checkpoint, description=f"{where} + adapter {adapter.directory}",
                               left_out=left_out)


def _model_names(keys: Iterable[str], prefix: str) -> frozenset[str]:
    """File keys as the model would name them unchanged (a saved embedding's base layer)."""
    return frozenset(prefix + k.removeprefix(PEFT_PREFIX) for k in keys)


def with_adapter(data: LoadPlanData, adapter: Adapter, injected: InjectedAdapter,
                 fused: tuple[FusedTarget, ...], keys: tuple[str, ...] | None = None,
                 replaced: tuple[Replacement, ...] = ()) -> LoadPlanData:
    """``data`` with the adapter's section and problems; raises when nothing lands.
    ``keys``: the adapter's (default: the plan's whole checkpoint); ``replaced``: the base
    tensors the adapter's file replaces (:func:`adapter_first`)."""
    keys = tuple(data.checkpoint.entries) if keys is None else keys
    mine = set(keys)
    loaded = {e.key for c in data.conversions if c.loads for e in c.group.entries} & mine
    placed = any(c.in_graph and any(e.key in mine for e in c.group.entries)
                 for c in data.conversions)  # (a shape mismatch has its place)
    if keys and not placed:
        example = sorted(keys)[0]
        wanted = sorted(n for n in (data.model_info.tensors if data.model_info else ()))[:1]
        raise AdapterError(f"{adapter.weights}: none of the adapter's {len(keys)} tensors has "
                           f"a place in the model's adapter {injected.name!r} (e.g. "
                           f"{example!r}; the model holds {wanted or 'no adapter tensors'}): "
                           + _which_directory(adapter, injected.name))
    converted = [e.key for c in data.conversions if c.loads and c.group.ops
                 for e in c.group.entries if e.key in mine]  # (per-expert linears fused)
    conversions = tuple(_layouts(adapter.config, injected, fused, converted))
    written = {t.key for c in data.conversions if c.loads for t in c.targets
               if t.status is TargetStatus.LOAD}
    fused_scales = _fused_scales(data, adapter.config, injected)
    changes = tuple(_scale_changes(adapter.config, injected, fused, written, fused_scales))
    problems = (*_peft_at_load(adapter.config), *_unplaced(data, adapter, mine),
                *_halves(data, adapter, fused), *_mixed_scales(adapter, fused_scales),
                *(_scale_problem(c, adapter.config) for c in changes))
    config = adapter.config
    summary = AdapterSummary(
        adapter.directory, injected.name, config.peft_type, config.r, config.lora_alpha,
        scale_of(config.r, config.lora_alpha, config.use_rslora), config.use_rslora,
        config.use_dora, _targets(config), config.modules_to_save, len(keys), len(loaded),
        *_bytes(data, mine), conversions, changes,
        json.dumps(dict(config.raw), indent=2, sort_keys=True) + "\n", replaced=replaced,
        rank_pattern=tuple(config.rank_pattern.items()),
        alpha_pattern=tuple(config.alpha_pattern.items()), layers=_layers(config))
    findings = dataclasses.replace(data.findings, problems=tuple(problems)
                                   + data.findings.problems,
                                   notes=data.findings.notes + tuple(_shared_only(config, fused)))
    tokens = trainable_tokens(injected)
    return dataclasses.replace(data, findings=token_findings(findings, data, tokens, config.file),
                               adapter=dataclasses.replace(summary, tokens=tokens))


def _which_directory(adapter: Adapter, name: str) -> str:
    """The likely cause of an adapter file with no tensor in place: peft saves adapter
    ``name`` (not ``default``) in a subfolder of that name."""
    sub = os.path.join(adapter.directory, name)
    if name != "default" and os.path.isfile(os.path.join(sub, "adapter_config.json")):
        return (f"peft saves adapter {name!r} in its own subfolder: give {sub} (this "
                "directory's adapter is the one saved as 'default')")
    return "is it the adapter of another base model?"


def _bytes(data: LoadPlanData, mine: set[str]) -> tuple[int, int]:
    """The adapter's bytes read and written (a plan with the base holds more)."""
    entries = data.checkpoint.entries
    read = sum(entries[k].nbytes for k in mine if k in entries)
    written = sum(t.dest.nbytes for c in data.conversions if c.loads
                  and any(e.key in mine for e in c.group.entries)
                  for t in c.targets if t.status is TargetStatus.LOAD)
    return read, written


def _shared_only(config: AdapterConfig, fused: tuple[FusedTarget, ...]) -> Iterable[Note]:
    """``target_modules`` naming routed experts' linears the model fused and doesn't adapt:
    only shared experts (or dense layers) of that name get a LoRA."""
    named = config.target_modules if isinstance(config.target_modules, tuple) else ()
    for f in fused:
        hit = [linear for linear in f.linears if linear in named]
        if hit and f.wrapper is None and not config.names_parameter(f.parameter):
            yield Note(f.parameter, f"target_modules {hit} match only linears outside the "
                       f"routed experts here (shared experts, dense layers): the routed "
                       f"experts' fused {f.parameter} gets no LoRA; to adapt them, train with "
                       f"target_parameters=['{f.parameter}']")


def _layers(config: AdapterConfig) -> tuple[int, ...]:
    """``layers_to_transform`` as a tuple (peft takes one int or a list)."""
    layers = config.raw.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        return (layers,)
    return tuple(x for x in layers if isinstance(x, int)) if isinstance(layers, list) else ()


def _targets(config: AdapterConfig) -> tuple[str, ...]:
    modules = config.target_modules
    named = (modules,) if isinstance(modules, str) else tuple(modules or ())
    return named + config.target_parameters


_BASE_REWRITING_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")


def _peft_at_load(config: AdapterConfig) -> Iterable[Problem]:
    """Config fields that make peft change the model when it loads the adapter, beyond
    its tensors: a plan of the file's tensors would load another model than peft's."""
    init = config.raw.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_REWRITING_INITS):
        yield Problem(ProblemKind.ADAPTER, "init_lora_weights", (
            f"{config.file}: init_lora_weights {init!r}: this initialisation subtracts the "
            "adapter's initial factors from the base weights, and peft recomputes that "
            "residual base when it loads the adapter; weightplan loads the base as stored, "
            "so the model would differ from the trained one; convert the adapter to a plain "
            "LoRA with peft (save_pretrained(..., path_initial_model_for_weight_conversion="
            "...)) and load that"))


def _unplaced(data: LoadPlanData, adapter: Adapter, mine: set[str]) -> Iterable[Problem]:
    halves = {k for inc in data.routing.incomplete for k in inc.present}  # (said once, below)
    for key in sorted((data.unexpected & mine) - halves):
        yield Problem(ProblemKind.ADAPTER, key, f"{key} (in {adapter.weights}) has no place "
                      "in the model's adapter: it would be left out, and the adapted model "
                      "would be silently wrong; inject the adapter with the same targets "
                      "(target_modules / target_parameters) it was trained with")


def _halves(data: LoadPlanData, adapter: Adapter, fused: tuple[FusedTarget, ...]
            ) -> Iterable[Problem]:
    """Fused-pair groups of the adapter with one half in the file and not the other."""
    for inc in data.routing.incomplete:
        sources = inc.converter.source_patterns
        pair = next((f for f in fused if f.pair and len(f.linears) == len(sources) and all(
            f".{linear}.lora_" in s for linear, s in zip(f.linears, sources, strict=True))), None)
        if not inc.present or pair is None:
            continue
        found = [linear for linear in pair.linears if any(f".{linear}.lora_" in k
                                                          for k in inc.present)]
        yield Problem(ProblemKind.ADAPTER, inc.present[0], (
            f"{adapter.weights} adapts {found} but not the rest of {list(pair.linears)}, "
            f"fused into {pair.parameter}: a LoRA on one half of a fused weight can't be "
            "represented exactly in the fused layout; train the adapter on both halves, or "
            "load it into a model with per-expert linears"))


def _fused_scales(data: LoadPlanData, config: AdapterConfig, injected: InjectedAdapter
                  ) -> dict[str, dict[float, list[str]]]:
    """Each fused LoRA layer the file's per-expert linears load into → the scales the config
    trains those linears with (their ``rank_pattern`` / ``alpha_pattern``), each with its
    modules; empty when the config has no patterns (one scale, said by the config's r)."""
    if not (config.rank_pattern or config.alpha_pattern):
        return {}
    wrappers = [layer for layer in injected.layers.values() if layer.parameter is not None]
    trained: dict[str, dict[float, list[str]]] = {}
    for c in data.conversions:
        if not (c.loads and c.group.ops):
            continue
        for t in c.targets:
            layer = next((w for w in wrappers if t.key.startswith(f"{w.path}.lora_")), None)
            if layer is None:
                continue
            for e in c.group.entries:
                module = e.key.removeprefix(PEFT_PREFIX).rsplit(".lora_", 1)[0]
                scales = trained.setdefault(layer.target, {})
                scales.setdefault(config.scale(module), []).append(module)
    return trained


def _mixed_scales(adapter: Adapter, fused_scales: dict[str, dict[float, list[str]]]
                  ) -> Iterable[Problem]:
    """Per-expert linears fused into one LoRA layer (one scale) that the config trains with
    different scales (a pattern on the gate and not the up linear, or on some experts): no
    fused form is exact."""
    for target, scales in fused_scales.items():
        if len(scales) > 1:
            said = "; ".join(f"{s:.6g} ({', '.join(sorted(set(m))[:3])}"
                             f"{', …' if len(set(m)) > 3 else ''})" for s, m in scales.items())
            yield Problem(ProblemKind.ADAPTER, target, (
                f"{adapter.config.file}: the per-expert linears fused into {target} were "
                f"trained with different scales (rank_pattern / alpha_pattern): {said}; the "
                "fused LoRA layer has one scale, so no fused form is exact; load the adapter "
                "into a model with per-expert linears"))


def _layouts(config: AdapterConfig, injected: InjectedAdapter, fused: tuple[FusedTarget, ...],
             converted: list[str]) -> Iterable[LayoutConversion]:
    """The fused parameters whose LoRA tensors the file holds per expert (``converted``:
    the adapter's keys that went through a converter); a file saved fused loads as it is."""
    for f in fused:
        layer = next((x for x in injected.layers.values() if x.parameter == f.parameter), None)
        if layer is None or not any(f".{f.linears[0]}." in k for k in converted):
            continue
        r, alpha = config.rank_alpha(f.linears[0])
        model_r = layer.r
        model_alpha = layer.scaling * (model_r ** 0.5 if config.use_rslora else model_r)
        names = ", ".join(f.linears)
        how = ("lora_A concatenated along the rank, lora_B block-diagonal" if f.pair
               else "lora_A and lora_B stacked")
        yield LayoutConversion(f.sources, f.parameter, (r, model_r), (alpha, model_alpha),
                               f"per-expert {names} → {f.parameter}: {how}, packed as peft's "
                               "ParamWrapper (lora_A (E·r, in) expert-slowest, lora_B "
                               "(out, r·E) expert-fastest)")


def _scale_changes(config: AdapterConfig, injected: InjectedAdapter,
                   fused: tuple[FusedTarget, ...], written: set[str],
                   fused_scales: dict[str, dict[float, list[str]]]) -> Iterable[ScaleChange]:
    """Layers the file loads into whose model scale differs from the trained one (a fused
    parameter saved per expert was trained with its linears' rank and alpha)."""
    linears = {f.parameter: f.linears[0] for f in fused}
    seen: set[tuple[str, float, float]] = set()
    for layer in injected.layers.values():
        if not any(k.startswith(f"{layer.path}.lora_") for k in written):
            continue
        module = layer.target.removeprefix(injected.prefix)
        if layer.parameter is not None and not config.names_parameter(module):
            module = linears.get(layer.parameter, module)
        trained = config.scale(module)
        if len(fused_scales.get(layer.target, ())) == 1:  # (its per-expert linears' own)
            trained = next(iter(fused_scales[layer.target]))
        if abs(layer.scaling - trained) > _TOLERANCE * max(1.0, abs(trained)):
            where = layer.parameter or module
            if (where, trained, layer.scaling) not in seen:
                seen.add((where, trained, layer.scaling))
                yield ScaleChange(layer.target, trained, layer.scaling)


def _scale_problem(change: ScaleChange, config: AdapterConfig) -> Problem:
    why = (" (peft doubles alpha with the rank when it fuses a pair, which changes an rsLoRA "
           "scale alpha/√r by √2; inject with alpha multiplied by √2 for the fused target)"
           if config.use_rslora else "")
    return Problem(ProblemKind.ADAPTER, change.target, (
        f"the model scales {change.target}'s LoRA by {change.model:.6g}, the adapter was "
        f"trained with {change.trained:.6g}{why}; its output would differ"))
