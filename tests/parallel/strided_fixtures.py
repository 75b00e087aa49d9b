"""Checkpoints with rows wide enough for strided reads to pay: hidden 512, bf16 and FP8.

Llama, Mixtral and DeepSeek-V3 layouts (per-expert keys, written by transformers'
``save_pretrained``; FP8 rewritten in DeepSeek-V3's layout by ``tests/fp8/checkpoints``),
every dimension a multiple of 128 and of 4 ranks, so that a rank's column slice of an
``o_proj`` / ``down_proj`` is 1/2 or 1/4 of each row.
"""

from __future__ import annotations

from pathlib import Path

from tests.fp8.checkpoints import build as fp8_build

COMMON = dict(hidden_size=512, num_hidden_layers=2, vocab_size=512, tie_word_embeddings=False,
              num_attention_heads=4, num_key_value_heads=4)
NAMES = ("llama", "mixtral", "dsv3")


def family(name: str):
    """``(model class, config)``."""
    import transformers as T
    if name == "llama":
        return T.LlamaForCausalLM, T.LlamaConfig(**COMMON, intermediate_size=1024, head_dim=128)
    if name == "mixtral":
        return T.MixtralForCausalLM, T.MixtralConfig(
            **COMMON, intermediate_size=512, num_local_experts=4, num_experts_per_tok=2,
            head_dim=128)
    if name == "dsv3":
        return T.DeepseekV3ForCausalLM, T.DeepseekV3Config(
            **COMMON, intermediate_size=1024, moe_intermediate_size=512, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
            q_lora_rank=256, kv_lora_rank=256, qk_rope_head_dim=64, qk_nope_head_dim=64,
            v_head_dim=128, n_group=1, topk_group=1)
    raise KeyError(name)


def build(name: str, root: Path) -> tuple[Path, Path]:
    """``(bf16 dir, fp8 dir)`` of ``name`` under ``root`` (written once)."""
    return fp8_build(name, root, family)
