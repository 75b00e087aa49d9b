"""Config fields peft acts on when it loads an adapter, which a plan of tensors alone would
silently drop: an ``init_lora_weights`` that rewrites the base weights (PiSSA, OLoRA, …:
peft recomputes the residual base at load). Each is a problem
in the plan naming the file and the field, refused by ``execute()`` — never a model that
differs from peft's without a word."""

from __future__ import annotations

import pytest
import torch

import weightplan
from weightplan.errors import AdapterError
from weightplan.planner.core.problems import ProblemKind

from tests.adapters.builders import tiny_model

peft = pytest.importorskip("peft")
IDS = torch.arange(10)[None]


def _trained(tmp_path, **config):
    """A base directory and an adapter trained (its factors moved) from ``config``."""
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    tiny_model("llama").save_pretrained(base)
    torch.manual_seed(0)
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                peft.LoraConfig(r=4, lora_alpha=8, **config))
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "adapter")
    return base, tmp_path / "adapter", model(IDS).logits


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_an_init_that_rewrites_the_base_is_refused_by_name(tmp_path, init):
    from transformers import AutoModelForCausalLM

    base, adapter, trained = _trained(tmp_path, target_modules=["q_proj"],
                                      init_lora_weights=init)
    oracle = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    assert torch.equal(oracle(IDS).logits, trained)  # peft recomputes the residual base
    with pytest.raises(AdapterError, match=rf"init_lora_weights.*{init}"):
        weightplan.from_pretrained(base, adapter=adapter)
    with pytest.raises(AdapterError, match=rf"init_lora_weights.*{init}"):
        weightplan.from_pretrained(base, adapter=adapter, merge=True)
    model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj"]))
    plan = weightplan.explain(model, adapter)
    problems = [p for p in plan.problems if p.kind is ProblemKind.ADAPTER]
    assert [p.key for p in problems] == ["init_lora_weights"]
    assert "adapter_config.json" in problems[0].message and init in problems[0].message
    with pytest.raises(AdapterError):
        plan.execute()


def test_a_plain_init_loads(tmp_path):
    base, adapter, trained = _trained(tmp_path, target_modules=["q_proj"],
                                      init_lora_weights="gaussian")
    assert torch.equal(weightplan.from_pretrained(base, adapter=adapter)(IDS).logits, trained)
