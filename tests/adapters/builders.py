"""Tiny transformers models and peft adapters for the adapter tests (built, not downloaded).

Per-expert (transformers v4) adapter files are written by hand, key by key, as peft saved
them for the per-expert linears: ``base_model.model.<...>.experts.{e}.<linear>.lora_A.weight``
``(r, in)`` and ``.lora_B.weight`` ``(out, r)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

PREFIX = "base_model.model."
SHARED = 20  # Qwen2-MoE's shared expert intermediate size here


@dataclass(frozen=True)
class Family:
    """A MoE family's per-expert names: (gate, up, down) linears and where experts sit."""

    name: str
    experts: str  # the per-expert module path under a layer (v4 naming)
    gate: str
    up: str
    down: str


MIXTRAL = Family("mixtral", "block_sparse_moe.experts", "w1", "w3", "w2")
QWEN2_MOE = Family("qwen2_moe", "mlp.experts", "gate_proj", "up_proj", "down_proj")
QWEN3_MOE = Family("qwen3_moe", "mlp.experts", "gate_proj", "up_proj", "down_proj")
DEEPSEEK_V3 = Family("deepseek_v3", "mlp.experts", "gate_proj", "up_proj", "down_proj")


def tiny_config(family: str, *, experts: int = 4, hidden: int = 16, inter: int = 12,
                layers: int = 2):
    from transformers import (
        DeepseekV3Config, GptOssConfig, LlamaConfig, MixtralConfig, Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    common = dict(vocab_size=64, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=2, num_key_value_heads=1)
    if family == "mixtral":
        return MixtralConfig(**common, intermediate_size=inter, num_local_experts=experts,
                             num_experts_per_tok=2)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(**common, intermediate_size=32, moe_intermediate_size=inter,
                              shared_expert_intermediate_size=SHARED, num_experts=experts,
                              num_experts_per_tok=2)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**common, intermediate_size=32, moe_intermediate_size=inter,
                              num_experts=experts, num_experts_per_tok=2, head_dim=8,
                              decoder_sparse_step=1)
    if family == "deepseek_v3":  # (every layer MoE; no q LoRA: a plain q_proj)
        return DeepseekV3Config(**common, intermediate_size=32, moe_intermediate_size=inter,
                                n_routed_experts=experts, num_experts_per_tok=2,
                                n_shared_experts=1, first_k_dense_replace=0, q_lora_rank=None,
                                kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
                                v_head_dim=8, n_group=1, topk_group=1)
    if family == "gpt_oss":  # experts stored (E, in, out)
        return GptOssConfig(**common, intermediate_size=inter, num_local_experts=experts,
                            num_experts_per_tok=2, head_dim=8, sliding_window=8)
    return LlamaConfig(**common, intermediate_size=32)


def tiny_model(family: str, seed: int = 0, **sizes) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(family, **sizes)).eval()


def write_config(directory: str, **fields) -> None:
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 8, "use_rslora": False,
              "use_dora": False, "target_modules": [], "lora_dropout": 0.0,
              "bias": "none", "task_type": None, "base_model_name_or_path": None,
              "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None}
    config.update(fields)
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f)


def per_expert_adapter(directory: str, family: Family, *, experts: int = 4, hidden: int = 16,
                       inter: int = 12, layers: int = 2, r: int = 2, alpha: float = 8,
                       rslora: bool = False, linears: tuple[str, ...] | None = None,
                       attention: bool = True, seed: int = 1) -> dict[str, torch.Tensor]:
    """Write a per-expert (v4) LoRA adapter; returns its tensors."""
    os.makedirs(directory, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    linears = linears or (family.gate, family.up, family.down)
    tensors = {}
    for layer in range(layers):
        for e in range(experts):
            for linear in linears:
                fan_in, fan_out = (inter, hidden) if linear == family.down else (hidden, inter)
                key = f"{PREFIX}model.layers.{layer}.{family.experts}.{e}.{linear}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(r, fan_in, generator=g)
                tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, r, generator=g)
        if attention:
            key = f"{PREFIX}model.layers.{layer}.self_attn.q_proj"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, hidden, generator=g)
            tensors[f"{key}.lora_B.weight"] = torch.randn(hidden, r, generator=g)
        shared = {QWEN2_MOE: ("shared_expert", SHARED), DEEPSEEK_V3: ("shared_experts", inter)}
        if family in shared:  # the shared expert's linears share the routed ones' names
            path, size = shared[family]
            for linear in linears:
                fan_in, fan_out = (size, hidden) if linear == family.down else (hidden, size)
                key = f"{PREFIX}model.layers.{layer}.mlp.{path}.{linear}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(r, fan_in, generator=g)
                tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, r, generator=g)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    targets = list(linears) + (["q_proj"] if attention else [])
    write_config(directory, r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=targets)
    return tensors


def lora_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def zero_lora(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.zero_()
