"""Built-in expert families against transformers' from_pretrained: Qwen2-MoE, Qwen3-MoE,
OLMoE, DeepSeek-V3 (per-expert checkpoints → stacked gate_up_proj / down_proj)."""

import pytest
import torch

from tests.interop.oracle import assert_same, keys, load_both, save

import transformers as T  # noqa: E402  (a dev dependency: always installed by `make test`)

TEXT = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)


def qwen2_moe():
    return T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig(
        **TEXT, intermediate_size=48, moe_intermediate_size=16, num_key_value_heads=2,
        shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2)


def qwen3_moe():
    return T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(
        **TEXT, intermediate_size=48, moe_intermediate_size=16, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, head_dim=8)


def olmoe():
    return T.OlmoeForCausalLM, T.OlmoeConfig(
        **TEXT, intermediate_size=16, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, eos_token_id=1, pad_token_id=0)


def deepseek_v3():
    return T.DeepseekV3ForCausalLM, T.DeepseekV3Config(
        **TEXT, intermediate_size=48, moe_intermediate_size=16, first_k_dense_replace=1,
        num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, n_shared_experts=1)


FAMILIES = {"qwen2_moe": qwen2_moe, "qwen3_moe": qwen3_moe, "olmoe": olmoe,
            "deepseek_v3": deepseek_v3}


@pytest.mark.parametrize("family", FAMILIES)
def test_per_expert_checkpoint_loads_like_from_pretrained(family, tmp_path):
    cls, cfg = FAMILIES[family]()
    directory = save(cls, cfg, tmp_path)
    assert any(".experts.3.gate_proj.weight" in k for k in keys(directory))
    model, reference, plan = load_both(cls, cfg, directory)
    assert plan.mapping.key == family
    assert plan.mapping.submodules[0].key == "qwen2_moe"
    assert "mlp.experts.gate_up_proj  f32[4, 32, 32]" in str(plan)
    assert_same(model, reference, {"input_ids": torch.tensor([[1, 5, 9, 14, 2, 7]])})


def test_the_stacked_layout_loads_without_conversion(tmp_path):
    cls, cfg = qwen3_moe()
    directory = save(cls, cfg, tmp_path, original_format=False)
    assert any(k.endswith("experts.gate_up_proj") for k in keys(directory))
    model, reference, plan = load_both(cls, cfg, directory)
    assert all(r.converter is None and not r.fired for r in plan.routing.routes)
    assert_same(model, reference, {"input_ids": torch.tensor([[3, 1, 4, 1, 5]])})
