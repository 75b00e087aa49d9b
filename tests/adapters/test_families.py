"""More MoE families, each tiny model built with transformers' own classes: Qwen3-MoE and
DeepSeek-V3 per-expert (v4) adapters into fused experts (peft's load as the oracle, bit for
bit, equal logits; the per-expert math oracle), and gpt-oss, whose experts are stored
``(E, in, out)``: a fused adapter loaded like peft and merged with the transposed delta."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightplan
from weightplan.api.adapters import explain_with_adapter
from weightplan.bridge.hub import build_empty_model
from weightplan.errors import AdapterError

from tests.adapters.builders import (
    DEEPSEEK_V3, PREFIX, QWEN3_MOE, per_expert_adapter, tiny_model, zero_lora,
)
from tests.adapters.test_experts import _check_math, _injected

peft = pytest.importorskip("peft")


@pytest.mark.parametrize("fam", [QWEN3_MOE, DEEPSEEK_V3], ids=lambda f: f.name)
def test_per_expert_adapter_matches_peft_bit_for_bit(tmp_path, fam):
    d = str(tmp_path / "v4")
    tensors = per_expert_adapter(d, fam, r=3, alpha=6)
    oracle = peft.PeftModel.from_pretrained(tiny_model(fam.name), d)
    assert any(".experts.base_layer.lora_A" in n for n, _ in oracle.named_parameters())
    model = copy.deepcopy(oracle)
    zero_lora(model)
    shared = {k for k in tensors if ".shared_experts." in k}
    if shared:
        # peft is wrong for DeepSeek-V3: its v4 → v5 config rewrite moves the shared
        # experts' gate/up/down_proj targets to the routed experts, silently dropping their
        # LoRA; weightplan names each dropped tensor and loads nothing (its own injection
        # keeps them: test_per_expert_adapter_math_oracle_in_place). The rest is compared.
        assert not any(".shared_experts." in n and "lora" in n
                       for n, _ in oracle.named_parameters())
        plan = weightplan.explain(model, d)
        assert {p.key for p in plan.problems} == shared
        with pytest.raises(AdapterError, match="nothing was loaded"):
            plan.execute()
        d = str(tmp_path / "routed")
        os.makedirs(d)
        shutil.copy(tmp_path / "v4" / "adapter_config.json", d)
        save_file({k: v for k, v in tensors.items() if k not in shared},
                  f"{d}/adapter_model.safetensors")
    _loads_like_peft(model, d, oracle)
    _check_math(model, tensors, fam, 6 / 3, prefix=PREFIX)


@pytest.mark.parametrize("fam", [QWEN3_MOE, DEEPSEEK_V3], ids=lambda f: f.name)
def test_per_expert_adapter_math_oracle_in_place(tmp_path, fam):
    d = str(tmp_path / "v4")
    tensors = per_expert_adapter(d, fam, r=2, alpha=5, rslora=True)
    model = _injected(fam.name, d)
    plan = weightplan.explain(model, d)
    assert not plan.problems and not plan.missing and not plan.unexpected, plan.problems
    plan.execute()
    _check_math(model, tensors, fam, 5 / 2 ** 0.5)
    state = model.state_dict()
    for key in (k for k in tensors if ".shared_experts." in k):  # (DeepSeek-V3's)
        name = key.removeprefix(PREFIX).replace(".weight", ".default.weight")
        assert torch.equal(state[name], tensors[key]), key


def _loads_like_peft(model, adapter_dir, oracle):
    """``adapter_dir`` loads into ``model`` without a problem, every tensor and the logits
    equal to peft's ``oracle``."""
    plan = weightplan.explain(model, adapter_dir)
    assert not plan.problems and not plan.unexpected, plan.problems
    plan.execute()
    theirs, ours = oracle.state_dict(), model.state_dict()
    assert [k for k in theirs if not torch.equal(theirs[k], ours[k])] == []
    ids = torch.arange(12)[None]
    assert torch.equal(oracle(ids).logits, model(ids).logits)


def _gpt_oss_adapter(tmp_path):
    config = peft.LoraConfig(r=2, lora_alpha=6, init_lora_weights=False,
                             target_modules=["q_proj"],
                             target_parameters=["gate_up_proj", "down_proj"])
    torch.manual_seed(2)
    trained = peft.get_peft_model(tiny_model("gpt_oss"), config)
    trained.save_pretrained(tmp_path / "lora")
    return config


def test_gpt_oss_transposed_experts_load_like_peft(tmp_path):
    _gpt_oss_adapter(tmp_path)
    oracle = peft.PeftModel.from_pretrained(tiny_model("gpt_oss"), str(tmp_path / "lora"))
    model = copy.deepcopy(oracle)
    zero_lora(model)
    _loads_like_peft(model, str(tmp_path / "lora"), oracle)


def test_gpt_oss_merge_adds_the_transposed_delta_per_expert(tmp_path):
    _gpt_oss_adapter(tmp_path)
    tiny_model("gpt_oss").save_pretrained(tmp_path / "base")
    base = load_file(str(tmp_path / "base" / "model.safetensors"))
    lora = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    adapted = peft.PeftModel.from_pretrained(tiny_model("gpt_oss"), str(tmp_path / "lora"))
    model = build_empty_model(tmp_path / "base").model
    plan = explain_with_adapter(model, tmp_path / "base", tmp_path / "lora", merge=True)
    assert not plan.problems and "transposed" in str(plan)
    plan.execute()
    state = model.state_dict()
    for layer in range(2):
        for param, wrapper in (("gate_up_proj", "experts.base_layer"), ("down_proj", "experts")):
            key = f"model.layers.{layer}.mlp.experts.{param}"
            a = lora[f"{PREFIX}model.layers.{layer}.mlp.{wrapper}.lora_A.weight"]
            b = lora[f"{PREFIX}model.layers.{layer}.mlp.{wrapper}.lora_B.weight"]
            w = base[key]
            experts = w.shape[0]
            a_e = a.reshape(experts, -1, a.shape[-1])  # (E, r, in), expert slowest
            b_e = b.reshape(b.shape[0], -1, experts).permute(2, 0, 1)  # (E, out, r)
            for e in range(experts):
                want = w[e].float() + ((b_e[e] @ a_e[e]) * 3.0).T  # (in, out)
                assert torch.equal(state[key][e], want.to(w.dtype)), (key, e)
    ids = torch.arange(12)[None]
    torch.testing.assert_close(model(ids).logits, adapted(ids).logits, rtol=1e-4, atol=1e-4)
