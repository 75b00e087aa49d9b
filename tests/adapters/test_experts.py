"""Per-expert (v4) LoRA into fused experts: peft's own load as the oracle, bit for bit,
and the math oracle independent of peft: for every expert e, s·B_e·A_e from the file
equals the fused delta's slice for e (catches packing and orientation traps)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import weightplan
from weightplan.bridge.peft import inject
from weightplan.bridge.transformers import TransformersFinder
from weightplan.errors import AdapterError
from weightplan.planner.core.problems import ProblemKind
from weightplan.planner.inputs.adapter import read_adapter
from weightplan.planner.pipelines.load import choose_mapping

from tests.adapters.builders import (
    MIXTRAL, PREFIX, QWEN2_MOE, per_expert_adapter, tiny_model, zero_lora,
)

peft = pytest.importorskip("peft")


def _injected(family: str, directory: str, **sizes) -> torch.nn.Module:
    model = tiny_model(family, **sizes)
    base = choose_mapping(None, model, TransformersFinder()).transforms
    return inject(model, read_adapter(directory), base, low_cpu_mem_usage=False)


def _check_math(model, tensors, fam, scale, *, layers=2, experts=4, prefix=""):
    """s·B_e·A_e per expert == the fused delta's slice, for gate|up and down."""
    root = model.base_model.model if prefix else model
    for layer in range(layers):
        wrapper = root.model.layers[layer].mlp.experts
        down, gate_up = wrapper.get_delta_weight("default"), \
            wrapper.base_layer.get_delta_weight("default")
        for e in range(experts):
            key = f"{PREFIX}model.layers.{layer}.{fam.experts}.{e}."

            def delta(linear, key=key):
                return scale * tensors[f"{key}{linear}.lora_B.weight"].double() \
                    @ tensors[f"{key}{linear}.lora_A.weight"].double()
            want = torch.cat([delta(fam.gate), delta(fam.up)])
            torch.testing.assert_close(gate_up[e].double(), want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(down[e].double(), delta(fam.down), rtol=1e-5, atol=1e-5)


def test_mixtral_matches_peft_bit_for_bit(tmp_path):
    d = str(tmp_path / "v4")
    tensors = per_expert_adapter(d, MIXTRAL)
    oracle = peft.PeftModel.from_pretrained(tiny_model("mixtral"), d)
    model = copy.deepcopy(oracle)
    zero_lora(model)
    plan = weightplan.explain(model, d)
    assert not plan.problems, plan.problems
    assert plan.adapter.loaded_tensors == len(tensors) == 52
    plan.execute()
    theirs, ours = oracle.state_dict(), model.state_dict()
    assert [k for k in theirs if not torch.equal(theirs[k], ours[k])] == []
    ids = torch.arange(12)[None]
    assert torch.equal(oracle(ids).logits, model(ids).logits)
    _check_math(model, tensors, MIXTRAL, 8 / 2, prefix=PREFIX)


def test_section_shows_each_layout_conversion(tmp_path):
    d = str(tmp_path / "v4")
    per_expert_adapter(d, MIXTRAL)
    text = str(weightplan.explain(_injected("mixtral", d), d))
    assert "layout: per-expert w1, w3 → gate_up_proj: lora_A concatenated along the rank, " \
           "lora_B block-diagonal" in text
    assert "rank 2 → 4, alpha 8 → 16" in text
    assert "per-expert w2 → down_proj" in text and "rank 2 → 2, alpha 8 → 8" in text


@pytest.mark.parametrize("rslora", [False, True])
@pytest.mark.parametrize("fam, family", [(MIXTRAL, "mixtral"), (QWEN2_MOE, "qwen2_moe")])
def test_math_oracle(tmp_path, fam, family, rslora):
    d = str(tmp_path / "v4")
    tensors = per_expert_adapter(d, fam, rslora=rslora, r=3, alpha=6)
    model = _injected(family, d)
    plan = weightplan.explain(model, d)
    assert not plan.problems and not plan.missing and not plan.unexpected, plan.problems
    plan.execute()
    _check_math(model, tensors, fam, 6 / math.sqrt(3) if rslora else 6 / 3)


def test_qwen2_moe_routed_experts_peft_leaves_out_load_here(tmp_path):
    d = str(tmp_path / "v4")
    tensors = per_expert_adapter(d, QWEN2_MOE)
    oracle = peft.PeftModel.from_pretrained(tiny_model("qwen2_moe"), d)
    assert not any(".experts.lora_" in n or "experts.base_layer.lora" in n
                   for n, _ in oracle.named_parameters())  # peft 0.21: dropped silently
    model = _injected("qwen2_moe", d)
    plan = weightplan.explain(model, d)
    assert plan.adapter.loaded_tensors == len(tensors)
    plan.execute()
    shared = "model.layers.1.mlp.shared_expert.up_proj.lora_B.default.weight"
    assert torch.equal(model.state_dict()[shared], tensors[
        f"{PREFIX}model.layers.1.mlp.shared_expert.up_proj.lora_B.weight"])


def test_rslora_scale_change_is_shown_and_refused(tmp_path):
    d = str(tmp_path / "v4")
    per_expert_adapter(d, MIXTRAL, rslora=True)
    peft_built = peft.PeftModel.from_pretrained(tiny_model("mixtral"), d)  # doubles alpha
    plan = weightplan.explain(peft_built, d)
    changes = plan.adapter.scale_changes
    assert len(changes) == 1 and changes[0].model / changes[0].trained == pytest.approx(
        math.sqrt(2))
    assert "scale change" in str(plan)
    assert any(p.kind is ProblemKind.ADAPTER and "√2" in p.message for p in plan.problems)
    with pytest.raises(AdapterError, match="scales"):
        plan.execute()


def test_one_half_of_a_fused_pair(tmp_path):
    d = str(tmp_path / "v4")
    per_expert_adapter(d, MIXTRAL, linears=("w1", "w2"))
    with pytest.raises(AdapterError, match=r"one half of a fused weight.*both halves"):
        _injected("mixtral", d)
    cfg = json.loads((tmp_path / "v4" / "adapter_config.json").read_text())
    model = peft.get_peft_model(tiny_model("mixtral"), peft.LoraConfig(
        r=cfg["r"], lora_alpha=cfg["lora_alpha"], target_parameters=["gate_up_proj",
                                                                      "down_proj"]))
    plan = weightplan.explain(model, d)
    halves = [p for p in plan.problems if "one half" in p.message]
    assert halves and "w1" in halves[0].key and "gate_up_proj" in halves[0].message


def test_target_modules_matching_only_shared_experts_is_a_note(tmp_path):
    trained = peft.get_peft_model(tiny_model("qwen2_moe"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["up_proj", "down_proj"], init_lora_weights=False))
    trained.save_pretrained(tmp_path / "shared")
    model = peft.get_peft_model(tiny_model("qwen2_moe"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["up_proj", "down_proj"]))
    plan = weightplan.explain(model, str(tmp_path / "shared"))
    assert not plan.problems
    notes = [n.message for n in plan.notes if "routed experts" in n.message]
    assert any("gate_up_proj" in n for n in notes) and any("down_proj" in n for n in notes)


def test_a_regex_target_modules_naming_per_expert_linears(tmp_path):
    """target_modules as one regex (peft's str form) over per-expert linears: the fused
    parameters it matches in the file get their LoRA as for a list of names — was refused
    with 48 'no place' problems advising to inject with the targets it was trained with."""
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    d = tmp_path / "v4"
    tensors = per_expert_adapter(str(d), MIXTRAL)
    config = json.loads((d / "adapter_config.json").read_text())
    config["target_modules"] = r".*\.(w1|w2|w3|q_proj)"
    (d / "adapter_config.json").write_text(json.dumps(config))
    model = weightplan.from_pretrained(tmp_path / "base", adapter=d)
    _check_math(model, tensors, MIXTRAL, 8 / 2)
    q = f"{PREFIX}model.layers.1.self_attn.q_proj.lora_B.weight"
    assert torch.equal(model.model.layers[1].self_attn.q_proj.lora_B.default.weight, tensors[q])
    config["target_modules"] = r".*\.(w1|w2|q_proj)"  # (one half of gate|up: can't be exact)
    (d / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="one half"):
        weightplan.from_pretrained(tmp_path / "base", adapter=d)
