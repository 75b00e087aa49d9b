"""What a model with injected LoRA adapters holds, read by duck typing (peft stays optional).

peft's LoRA layers carry ``lora_A`` / ``lora_B`` (or ``lora_embedding_A`` / ``_B``)
dicts by adapter name, a ``scaling`` and an ``r`` dict; a wrapped *parameter* (fused
experts, ``target_parameters``) is a ``ParamWrapper`` with a ``parameter_name``, nested
one ``base_layer`` deeper per wrapped parameter of the same module. peft's trainable
tokens (``trainable_token_indices``) wrap an embedding: its ``token_adapter`` holds the
base layer, a ``trainable_tokens_delta`` dict (the trained rows) and a
``trainable_tokens_original`` one (the base's rows, a non-persistent buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

PEFT_PREFIX = "base_model.model."
OWNED = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.",
         ".lora_magnitude_vector.", ".modules_to_save.", ".trainable_tokens_delta.")
TOKEN_ADAPTER = ".token_adapter"


@dataclass(frozen=True)
class LoraLayer:
    """One injected LoRA layer of the adapter: where it sits and what the model uses."""

    path: str  # the wrapper module's dotted path
    target: str  # what it adapts: a module path, or ``<module>.<parameter>`` for a wrapper
    r: int
    scaling: float
    parameter: str | None = None  # the wrapped parameter's name (fused experts)
    experts: int = 1  # experts packed in a wrapped 3-d parameter's factors
    transposed: bool = False  # its delta is (B·A)ᵀ: embeddings, fan_in_fan_out, (E, in, out)


@dataclass(frozen=True)
class InjectedAdapter:
    """The adapter ``name`` as injected in a model."""

    name: str
    prefix: str  # ``"base_model.model."`` for a PeftModel, else ``""``
    layers: Mapping[str, LoraLayer]  # by target
    saved_modules: tuple[str, ...]  # paths of modules_to_save wrappers holding ``name``
    modules: frozenset[str] = frozenset()  # every module path of the model
    parameters: frozenset[str] = frozenset()  # every parameter name of the model
    # trainable tokens: each token adapter's path (``model.embed_tokens.token_adapter``,
    # one tied to it left out: it shares its dicts) → the rows it trains
    tokens: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def owns(self, tensor_name: str) -> bool:
        """Whether a model tensor belongs to this adapter (its LoRA factors, DoRA
        magnitudes and trained copies of modules_to_save)."""
        return any(f"{part}{self.name}" in tensor_name for part in OWNED) and (
            tensor_name.endswith(f".{self.name}") or f".{self.name}." in tensor_name)

    def owns_factor(self, tensor_name: str) -> bool:
        """Whether a model tensor is one of this adapter's LoRA factors or DoRA magnitudes
        (peft keeps those float32 on a half-precision base; a trained copy of a module to
        save is the base module's, in the model's dtype)."""
        return self.owns(tensor_name) and ".modules_to_save." not in tensor_name

    def wrapper_of(self, module: str, parameter: str) -> str | None:
        """The path of the wrapper module adapting ``module``'s ``parameter``, if any."""
        layer = self.layers.get(f"{module}.{parameter}")
        return None if layer is None else layer.path


def adapter_tensor(tensor_name: str) -> bool:
    """Whether a model tensor belongs to some adapter (any name): a LoRA factor, a DoRA
    magnitude, a trained copy of a module to save."""
    return any(part in tensor_name for part in OWNED)


def injected_adapters(model: torch.nn.Module) -> tuple[str, ...]:
    """Names of the LoRA adapters injected in ``model`` (first seen first)."""
    names: dict[str, None] = {}
    for _, module in model.named_modules():
        for attr in ("lora_A", "lora_embedding_A"):
            found = getattr(module, attr, None)
            if isinstance(found, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
                names.update(dict.fromkeys(found.keys()))
    return tuple(names)


def inspect_adapter(model: torch.nn.Module, name: str) -> InjectedAdapter:
    """The layers of adapter ``name`` in ``model`` (empty when it isn't injected)."""
    params = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    prefix = PEFT_PREFIX if params and all(n.startswith(PEFT_PREFIX) for n in params) else ""
    layers: dict[str, LoraLayer] = {}
    saved, paths = [], []
    tokens: dict[str, tuple[int, ...]] = {}
    for path, module in model.named_modules():
        paths.append(path)
        rows = _token_rows(module, name)
        if rows is not None:
            tokens[path] = rows
        copies = getattr(module, "modules_to_save", None)
        if isinstance(copies, torch.nn.ModuleDict) and name in copies:
            saved.append(path)
        layer = _lora_layer(path, module, name)
        if layer is not None:
            layers[layer.target] = layer
    return InjectedAdapter(name, prefix, MappingProxyType(layers), tuple(saved),
                           frozenset(paths), frozenset(params), tuple(tokens.items()))


def _token_rows(module: torch.nn.Module, name: str) -> tuple[int, ...] | None:
    """The rows a trainable-tokens layer trains for adapter ``name`` (None: not one, or
    tied to another that holds them)."""
    delta = getattr(module, "trainable_tokens_delta", None)
    indices = getattr(module, "token_indices", None)
    if not isinstance(delta, torch.nn.ParameterDict) or name not in delta \
            or not isinstance(indices, dict) or getattr(module, "tied_adapter", None) is not None:
        return None
    return tuple(int(i) for i in indices[name])


def _lora_layer(path: str, module: torch.nn.Module, name: str) -> LoraLayer | None:
    held = [getattr(module, a, None) for a in ("lora_A", "lora_embedding_A")]
    if not any(isinstance(h, (torch.nn.ModuleDict, torch.nn.ParameterDict)) and name in h
               for h in held):
        return None
    r = int(getattr(module, "r", {}).get(name, 0))
    scaling = float(getattr(module, "scaling", {}).get(name, 0.0))
    parameter = getattr(module, "parameter_name", None)
    if not isinstance(parameter, str):
        embedding = isinstance(held[1], torch.nn.ParameterDict) and name in held[1]
        transposed = bool(getattr(module, "fan_in_fan_out", False)) or embedding
        return LoraLayer(path, path, r, scaling, transposed=transposed)
    owner = path
    while owner.endswith(".base_layer"):  # nested wrappers: the experts module's own path
        owner = owner[:-len(".base_layer")]
    experts = int(getattr(module, "num_experts", 1))
    # (peft swaps in/out for an (E, out, in) parameter; one it didn't swap is (E, in, out))
    transposed = experts > 1 and not getattr(module, "_did_swap_in_out_features", True)
    return LoraLayer(path, f"{owner}.{parameter}", r, scaling, parameter, experts, transposed)
