"""Inject a LoRA adapter into a model with peft (an optional dependency: the ``adapters``
extra), its config rewritten for the model's fused experts.

An adapter saved with per-expert linears (``experts.{e}.w1``, transformers v4) targets
modules the fused model no longer has. For each fused parameter of the model's mapping
whose linears the adapter targets, the config gains the parameter in
``target_parameters``, and for a fused pair the rank doubles (``rank_pattern``) with alpha
rewritten so that the scale stays the trained one: ``2·alpha`` for ``alpha/r``, ``√2·alpha``
with rsLoRA (``alpha/√r``; peft's own conversion doubles it, changing the scale by √2).
Every model type whose mapping fuses experts gets this, ``qwen2_moe`` included (peft's
alias table misses it and leaves its routed experts out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from weightplan.errors import AdapterError
from weightplan.planner.inputs.adapter import Adapter, AdapterConfig
from weightplan.planner.inputs.adapter_model import PEFT_PREFIX
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.keys.adapter_keys import FusedTarget, fused_targets
from weightplan.planner.keys.transforms import WeightTransform


def rewritten_config(config: AdapterConfig, model: torch.nn.Module,
                     base: Iterable[WeightTransform], modules: Iterable[str] = ()
                     ) -> dict[str, Any]:
    """peft's config dict for ``model``: per-expert targets moved to the fused parameters.
    A ``target_modules`` regex (peft's str form) names the linears it fully matches among
    ``modules`` (the adapter file's module paths); it stays, matching the plain modules.

    Raises:
        AdapterError: the adapter targets one half of a fused pair (can't be exact).
    """
    raw = dict(config.raw)
    targets = config.target_modules
    if targets is None and config.target_parameters:  # (None would get peft's defaults)
        raw.update(target_modules=[])
    if isinstance(targets, str):
        named: tuple[str, ...] = tuple({m.rsplit(".", 1)[-1] for m in modules
                                        if re.fullmatch(targets, m)})
    elif targets is None:  # (nothing: peft's defaults)
        return raw
    else:
        named = targets
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    parameters = list(config.target_parameters)
    ranks, alphas = dict(config.rank_pattern), dict(config.alpha_pattern)
    for f in fused_targets(base):
        hit = [linear for linear in f.linears if linear in named]
        if not hit or config.names_parameter(f.parameter):  # (trained fused: as it is)
            continue
        if len(hit) != len(f.linears):
            raise AdapterError(one_half_message(config.file, hit, f))
        r, alpha = config.rank_alpha(f.linears[0])
        factor = len(f.linears)
        key = rf".*\.{re.escape(f.parameter)}"
        ranks[key] = r * factor
        alphas[key] = alpha * (math.sqrt(factor) if config.use_rslora else factor)
        parameters.append(f.parameter)
    if isinstance(targets, tuple):
        kept = [t for t in targets if t in leaves or not _is_fused_linear(t, base)]
        raw.update(target_modules=kept or ([] if parameters else None))
    raw.update(target_parameters=sorted(set(parameters)) or None,
               rank_pattern=ranks, alpha_pattern=alphas)
    return raw


def per_expert_config(config: AdapterConfig, base: Iterable[WeightTransform]) -> dict[str, Any]:
    """The inverse of :func:`rewritten_config`: a fused parameter in ``target_parameters``
    back to its per-expert linears in ``target_modules``, each with its share of the rank
    and the alpha that keeps the scale (``alpha/n``; ``alpha/√n`` with rsLoRA).

    Raises:
        AdapterError: a fused pair's rank that its linears can't share equally.
    """
    raw = dict(config.raw)
    parameters = list(config.target_parameters)
    modules = list(config.target_modules) if isinstance(config.target_modules, tuple) else []
    ranks, alphas = dict(config.rank_pattern), dict(config.alpha_pattern)
    for f in fused_targets(base):
        named = [p for p in parameters if p == f.parameter or p.endswith(f".{f.parameter}")]
        if not named:
            continue
        r, alpha = config.rank_alpha(f"{f.module.strip('.')}.{f.parameter}")  # (a dotted name)
        n = len(f.linears)
        if r % n:
            raise AdapterError(f"{config.file}: {f.parameter}'s rank {r} can't be shared by "
                               f"its {n} per-expert linears {list(f.linears)}")
        parameters = [p for p in parameters if p not in named]
        for patterns in (ranks, alphas):
            for key in [k for k in patterns if k.endswith(f.parameter)]:
                del patterns[key]
        share = (r // n, alpha / (math.sqrt(n) if config.use_rslora else n))
        for linear in f.linears:
            modules += [] if linear in modules else [linear]
            if share != (config.r, config.lora_alpha):
                ranks[linear], alphas[linear] = share
    raw.update(target_modules=modules or None, target_parameters=parameters or None,
               rank_pattern=ranks, alpha_pattern=alphas)
    return raw


def one_half_message(file: str, hit: list[str], f: FusedTarget) -> str:
    return (f"{file}: target_modules names {hit} but not {[x for x in f.linears if x not in hit]}"
            f", fused into {f.parameter}: a LoRA on one half of a fused weight can't be "
            "represented exactly in the fused layout; train the adapter on both halves, or "
            "use a model with per-expert linears")


def _is_fused_linear(name: str, base: Iterable[WeightTransform]) -> bool:
    return any(name in f.linears for f in fused_targets(base))


def inject(model: torch.nn.Module, adapter: Adapter, base: Iterable[WeightTransform], *,
           name: str = "default", low_cpu_mem_usage: bool = True) -> torch.nn.Module:
    """``model`` with the adapter's LoRA layers injected in place (peft's
    ``inject_adapter_in_model``; on meta with ``low_cpu_mem_usage``), the config rewritten
    by :func:`rewritten_config`. The model keeps its class, as transformers'
    ``load_adapter`` does.

    Raises:
        AdapterError: peft is not installed, or it refuses the config (naming the file).
    """
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise AdapterError(f"{adapter.directory}: loading an adapter into a base needs peft "
                           "(pip install 'weightplan[adapters]')") from e
    modules: tuple[str, ...] = ()
    if isinstance(adapter.config.target_modules, str):  # (a regex: the file's modules)
        modules = tuple({k.removeprefix(PEFT_PREFIX).rsplit(".lora_", 1)[0]
                         for k in open_checkpoint(adapter.weights).entries if ".lora_" in k})
    raw = rewritten_config(adapter.config, model, tuple(base), modules)
    fields = {f.name for f in dataclasses.fields(LoraConfig)}
    try:
        config = LoraConfig(**{k: v for k, v in raw.items() if k in fields})
        config.inference_mode = True
        with _without_peft_conversion(model):
            return inject_adapter_in_model(config, model, adapter_name=name,
                                           low_cpu_mem_usage=low_cpu_mem_usage)
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise AdapterError(f"{adapter.config.file}: peft can't inject this adapter: {e}") from e


@contextlib.contextmanager
def _without_peft_conversion(model: torch.nn.Module) -> Iterator[None]:
    """peft's own v4 → v5 rewrite of the config skipped (it keys on the model config having
    a ``model_type``): the config is rewritten already, and peft's would move a shared
    expert's ``gate_proj`` (DeepSeek-V3) to the routed experts' parameter, dropping its LoRA,
    and double an rsLoRA alpha; skipped, it doesn't build transformers' every conversion
    mapping for it either (~0.2 s a process). The model's config is seen without
    ``model_type`` meanwhile (:class:`_NoModelType`)."""
    config = getattr(model, "config", None)
    if config is None:
        yield
        return
    setattr(model, "config", _NoModelType(config))  # noqa: B010 (a plain attribute)
    try:
        yield
    finally:
        setattr(model, "config", config)  # noqa: B010


class _NoModelType:
    """A config whose every attribute but ``model_type`` is the wrapped one's, read and
    written through (peft sets ``tie_word_embeddings``; ``to_dict`` is the config's)."""

    def __init__(self, config: Any) -> None:
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str) -> Any:
        if name in ("model_type", "_config"):  # (_config unset: a copy, an unpickle)
            raise AttributeError(name)
        return getattr(self._config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._config, name, value)
