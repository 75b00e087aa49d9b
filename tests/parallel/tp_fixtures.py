"""Tiny checkpoints for tensor/expert-parallel tests, written by transformers' save_pretrained.

Sizes are chosen so that shards are uneven: the vocabulary (102) splits 51/51 over 2 ranks and
26/26/26/24 over 4, and MoE experts keep the per-expert layout (so merges get sharded).
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=102, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=False)


def configs():
    import transformers as T

    return {
        "llama": (T.LlamaForCausalLM, T.LlamaConfig(**COMMON, intermediate_size=96, head_dim=16)),
        # lm_head tied to the embedding: one tensor, sharded once (rows of the vocabulary)
        "llamatied": (T.LlamaForCausalLM, T.LlamaConfig(**{**COMMON, "tie_word_embeddings": True},
                                                        intermediate_size=96, head_dim=16)),
        # every head its own key/value head: its attention runs on 4 ranks (2 KV heads can't)
        "llama4kv": (T.LlamaForCausalLM, T.LlamaConfig(**{**COMMON, "num_key_value_heads": 4},
                                                       intermediate_size=96, head_dim=16)),
        "qwen3moe": (T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(
            **COMMON, intermediate_size=96, moe_intermediate_size=48, num_experts=4,
            num_experts_per_tok=2, head_dim=16, mlp_only_layers=[0])),
        "mixtral": (T.MixtralForCausalLM, T.MixtralConfig(
            **COMMON, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
            head_dim=16)),
        "dsv3": (T.DeepseekV3ForCausalLM, T.DeepseekV3Config(
            **{**COMMON, "num_key_value_heads": 4}, intermediate_size=96,
            moe_intermediate_size=48, first_k_dense_replace=1, n_routed_experts=4,
            num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_shared_experts=1)),
    }


MOE = ("qwen3moe", "mixtral", "dsv3")
FOUR_RANKS = ("llama", "mixtral", "llama4kv")


def build(root: Path) -> dict[str, Path]:
    """Every fixture under ``root/<name>``, fp32, seeded; returns name → directory."""
    out = {}
    for name, (cls, cfg) in configs().items():
        directory = root / name
        if not (directory / "model.safetensors").exists():
            torch.manual_seed(0)
            cls(cfg).save_pretrained(directory)
        out[name] = directory
    return out
