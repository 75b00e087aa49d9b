"""Adapters trained on the fused layout name their parameters in ``target_parameters`` as
peft matches them: by the end of the parameter's dotted path (``experts.gate_up_proj``,
``mlp.experts.gate_up_proj``), with per-parameter ``rank_pattern`` keys. Such a file loads
as it is — its ranks are the file's, not a per-expert adapter's rewritten ones — beside
``target_modules`` of the same linear names on a shared expert."""

from __future__ import annotations

import pytest
import torch

import weightplan

from tests.adapters.builders import tiny_model

peft = pytest.importorskip("peft")
IDS = torch.arange(10)[None]


def _like_peft(tmp_path, family, **config):
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    tiny_model(family).save_pretrained(base)
    torch.manual_seed(1)
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                peft.LoraConfig(init_lora_weights=False, **config))
    model.save_pretrained(tmp_path / "adapter")
    oracle = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base),
                                            tmp_path / "adapter")
    mine = weightplan.from_pretrained(base, adapter=tmp_path / "adapter")
    theirs = {k.removeprefix("base_model.model."): v for k, v in oracle.state_dict().items()}
    assert {k: v.shape for k, v in mine.state_dict().items()} == {
        k: v.shape for k, v in theirs.items()}
    assert all(torch.equal(v, theirs[k]) for k, v in mine.state_dict().items())
    assert torch.equal(mine(IDS).logits, oracle(IDS).logits)


@pytest.mark.parametrize("rslora", [False, True])
def test_a_fused_parameter_with_its_own_rank_pattern(tmp_path, rslora):
    _like_peft(tmp_path, "mixtral", r=2, lora_alpha=4, use_rslora=rslora, target_modules=[],
               target_parameters=["experts.gate_up_proj", "experts.down_proj"],
               rank_pattern={"experts.gate_up_proj": 4})


def test_shared_expert_linears_beside_the_routed_experts_fused_parameter(tmp_path):
    _like_peft(tmp_path, "qwen2_moe", r=2, lora_alpha=4,
               target_modules=["gate_proj", "up_proj", "down_proj"],
               target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
