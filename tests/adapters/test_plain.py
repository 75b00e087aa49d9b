"""Plain-module LoRA (Llama) into a model with the adapter injected, against peft's own
``PeftModel.from_pretrained`` (the oracle) bit for bit, and the ways it can go wrong."""

from __future__ import annotations

import copy

import pytest
import torch

import weightplan
from weightplan.errors import AdapterError, ParallelError, PlanError, ShapeMismatchError
from weightplan.planner.core.problems import ProblemKind

from tests.adapters.builders import tiny_model, zero_lora

peft = pytest.importorskip("peft")  # the dev extra has it; the core never needs it


def _saved(tmp_path, name: str, **config) -> str:
    model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        init_lora_weights=False, **config))
    directory = str(tmp_path / name)
    model.save_pretrained(directory)
    return directory


def _fresh(directory: str) -> torch.nn.Module:
    """The oracle's model with its adapter values wiped: what weightplan must restore."""
    oracle = peft.PeftModel.from_pretrained(tiny_model("llama"), directory)
    model = copy.deepcopy(oracle)
    zero_lora(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".modules_to_save." in n:
                p.zero_()
    return oracle, model


def _same(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    sb = b.state_dict()
    return [k for k, v in a.state_dict().items() if not torch.equal(v, sb[k])]


def test_lora_loads_like_peft(tmp_path):
    d = _saved(tmp_path, "lora", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                    "down_proj"])
    oracle, model = _fresh(d)
    plan = weightplan.explain(model, d, adapter_name="default")
    assert not plan.problems and not plan.missing and not plan.unexpected
    assert plan.adapter.loaded_tensors == plan.adapter.file_tensors == 12
    plan.execute()
    assert _same(oracle, model) == []
    ids = torch.arange(10)[None]
    assert torch.equal(oracle(ids).logits, model(ids).logits)


def test_dora_embedding_modules_to_save_and_rank_pattern(tmp_path):
    d = _saved(tmp_path, "dora", r=4, lora_alpha=8, use_dora=True,
               target_modules=["q_proj", "embed_tokens"], modules_to_save=["lm_head"],
               rank_pattern={"q_proj": 2}, alpha_pattern={"q_proj": 3})
    oracle, model = _fresh(d)
    plan = weightplan.explain(model, d)
    assert not plan.problems, plan.problems
    plan.execute()
    assert _same(oracle, model) == []
    assert "DoRA" in str(plan) and "modules_to_save: lm_head" in str(plan)


def test_injected_in_place_without_the_peft_level(tmp_path):
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["k_proj"])
    oracle = peft.PeftModel.from_pretrained(tiny_model("llama"), d)
    model = peft.inject_adapter_in_model(peft.LoraConfig(r=2, lora_alpha=4,
                                                         target_modules=["k_proj"]),
                                         tiny_model("llama"))
    weightplan.load(model, d)
    theirs = {k.removeprefix("base_model.model."): v for k, v in oracle.state_dict().items()}
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())


def test_section_in_the_printed_plan(tmp_path):
    d = _saved(tmp_path, "lora", r=4, lora_alpha=8, target_modules=["q_proj"])
    text = str(weightplan.explain(_fresh(d)[1], d))
    assert "adapter: " in text and "rank 4, alpha 8, scale 2 (alpha/r)" in text
    assert "loads 4 of the adapter's 4 tensors" in text
    assert weightplan.explain(_fresh(d)[1], d).to_dict()["adapter"]["r"] == 4


def test_nothing_landing_raises_at_plan_time(tmp_path):
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["q_proj"])
    other = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["k_proj"]))
    with pytest.raises(AdapterError, match="none of the adapter's 4 tensors"):
        weightplan.explain(other, d)


def test_part_landing_is_a_problem_and_refused(tmp_path):
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["q_proj", "k_proj"])
    other = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["k_proj"]))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    plan = weightplan.explain(other, d)
    wrong = [p for p in plan.problems if p.kind is ProblemKind.ADAPTER]
    assert len(wrong) == 4 and all("q_proj" in p.key for p in wrong)
    with pytest.raises(AdapterError, match="nothing was loaded"):
        plan.execute()
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())


def test_adapter_of_another_base_names_key_and_shapes(tmp_path):
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["q_proj"])
    wider = peft.get_peft_model(tiny_model("llama", hidden=32), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"]))
    plan = weightplan.explain(wider, d)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert tuple(plan.mismatched[key]) == ((2, 16), (2, 32))
    with pytest.raises(ShapeMismatchError, match="q_proj"):
        plan.execute()


def test_unknown_adapter_name_and_tp_are_refused(tmp_path):
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["q_proj"])
    model = _fresh(d)[1]
    with pytest.raises(AdapterError, match="no adapter 'other'.*'default'"):
        weightplan.explain(model, d, adapter_name="other")
    with pytest.raises(ParallelError, match="adapter"):
        weightplan.explain(model, d, tp="auto")


def test_an_adapter_alone_takes_the_load_options_a_model_takes(tmp_path):
    """``dequantize_on=`` and ``cooperative=`` reach an adapter's plan as a model's (were
    dropped: a bad value, or cooperative= without tp=, planned as if never given)."""
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["q_proj"])
    oracle, model = _fresh(d)
    with pytest.raises(PlanError, match="dequantize_on='nowhere': one of 'auto', 'host', 'device'"):
        weightplan.explain(model, d, dequantize_on="nowhere")
    with pytest.raises(ParallelError, match="cooperative=True shares the reads.*pass tp= too"):
        weightplan.load(model, d, cooperative=True)
    weightplan.load(model, d, dequantize_on="host")
    assert _same(oracle, model) == []


def test_scale_changes_only_where_the_file_loads(tmp_path):
    d = _saved(tmp_path, "lora", r=2, lora_alpha=4, target_modules=["q_proj"])
    model = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "k_proj"],
        alpha_pattern={"k_proj": 7}))  # k_proj: not in the file, its scale is not the file's
    plan = weightplan.explain(model, d)
    assert plan.adapter.scale_changes == ()
    assert {p.kind for p in plan.problems} == {ProblemKind.MISSING}
    assert len(plan.missing) == 4  # k_proj's A and B, two layers: reported, not refused
    changed = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(
        r=2, lora_alpha=6, target_modules=["q_proj"]))
    changes = weightplan.explain(changed, d).adapter.scale_changes
    assert [(c.trained, c.model) for c in changes] == [(2.0, 3.0)] * 2


def test_section_shows_per_module_ranks_and_layers(tmp_path):
    """rank_pattern / alpha_pattern / layers_to_transform change which ranks, scales and
    layers the adapter has; the section said only the defaults ('rank 4, alpha 8, scale 2'
    for an adapter whose q_proj runs at rank 2)."""
    d = _saved(tmp_path, "p", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
               rank_pattern={"q_proj": 2}, alpha_pattern={"v_proj": 3},
               layers_to_transform=[1])
    plan = weightplan.explain(_fresh(d)[1], d)
    text = str(plan)
    assert "rank_pattern: q_proj 2; alpha_pattern: v_proj 3" in text
    assert "(layers 1)" in text
    section = plan.to_dict()["adapter"]
    assert [tuple(x) for x in section["rank_pattern"]] == [("q_proj", 2)]
    assert list(section["layers"]) == [1]
