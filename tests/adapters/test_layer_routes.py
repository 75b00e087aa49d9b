"""Base + adapter in one plan: the renamings that move base tensors under the LoRA wrappers
are patterns over layer numbers where the same rename holds for every layer (routed once
per key template), literal paths where the adapter differs by layer (routed key by key);
either way every tensor lands where peft puts it."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file
from hypothesis import given, settings
from hypothesis import strategies as st

import weightplan
from weightplan.api.adapters import explain_with_adapter
from weightplan.bridge.hub import build_empty_model
from weightplan.planner.inputs.adapter_model import inspect_adapter
from weightplan.planner.keys.adapter_keys import base_and_adapter_transforms, path_alternatives
from weightplan.planner.keys.templates import digit_blind

from tests.adapters.builders import tiny_model

peft = pytest.importorskip("peft")

_NAMES = ("self_attn.q_proj", "self_attn.v_proj", "mlp.experts", "mlp.down_proj")


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 25), data=st.data())
def test_path_alternatives_match_exactly_the_paths(layers, data):
    modules = {"", "model", "lm_head"} | {f"model.layers.{i}.{n}" for i in range(layers)
                                          for n in _NAMES}
    paths = data.draw(st.sets(st.sampled_from(sorted(modules - {""})), min_size=1))
    regex = re.compile(rf"^(?:{path_alternatives(paths, frozenset(modules))})$")
    probes = modules | {f"model.layers.{i}.{n}" for i in (layers, 10 * layers + 7)
                        for n in _NAMES}
    assert {m for m in modules if regex.match(m)} == paths
    for name in _NAMES:  # a name on every layer of a number's length: no layer number left
        for digits in (1, 2):
            numbers = [i for i in range(layers) if len(str(i)) == digits]
            if numbers and all(f"model.layers.{i}.{name}" in paths for i in numbers):
                assert all(regex.match(f"model.layers.{i}.{name}") is not None
                           for i in range(10 ** (digits - 1), 10 ** digits)), name
    if paths == modules - {""}:
        assert not re.search(r"[0-9]", regex.pattern)
    assert all(regex.match(p) is None for p in probes - modules if len(p.split(".")[2]) > 2)


def _transforms(model):
    injected = inspect_adapter(model, "default")
    transforms, _ = base_and_adapter_transforms(weightplan.get_mapping("mixtral"), injected)
    return transforms


def test_an_adapter_on_every_layer_is_routed_by_template():
    """12 layers: numbers of one and two digits, each a template of its own."""
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                             target_parameters=["gate_up_proj", "down_proj"])
    model = peft.inject_adapter_in_model(config, tiny_model("mixtral", layers=12))
    transforms = _transforms(model)
    assert all(map(digit_blind, transforms))
    assert any(r"layers\.\d\d\.mlp\.experts" in p for t in transforms
               for p in getattr(t, "source_patterns", ()))


def _layer_specific(tmp_path, family: str, config, layers: int = 12, fused: bool = False,
                    mapping=None):
    """``fused``: the base saved as the model holds it (fused experts), not as transformers
    saves it (per expert); ``mapping``: the base's, given (else looked up)."""
    base = tiny_model(family, layers=layers)
    base.save_pretrained(tmp_path / "base")
    if fused:
        save_file({k: v.contiguous() for k, v in base.state_dict().items()},
                  str(tmp_path / "base" / "model.safetensors"))
    torch.manual_seed(4)
    trained = peft.get_peft_model(tiny_model(family, seed=3, layers=layers), config)
    trained.save_pretrained(tmp_path / "lora")
    oracle = peft.PeftModel.from_pretrained(tiny_model(family, layers=layers),
                                            str(tmp_path / "lora"))
    plan = explain_with_adapter(build_empty_model(tmp_path / "base").model, tmp_path / "base",
                                tmp_path / "lora", mapping=mapping)
    assert not plan.problems and not plan.missing and not plan.unexpected, plan.problems
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora",
                                       mapping=mapping)
    theirs = {k.removeprefix("base_model.model."): v for k, v in oracle.state_dict().items()}
    ours = model.state_dict()
    assert set(theirs) == set(ours)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    return model


def test_plain_modules_on_some_layers_route_right(tmp_path):
    """q_proj on layers 1, 3 and 11 only (v_proj on all): the q_proj base weights of the
    other layers stay where they are."""
    config = peft.LoraConfig(r=2, lora_alpha=4, init_lora_weights=False, target_modules=(
        r".*\.(1|3|11)\.self_attn\.q_proj|.*\.self_attn\.v_proj"))
    model = _layer_specific(tmp_path, "llama", config)
    assert hasattr(model.model.layers[11].self_attn.q_proj, "base_layer")
    assert not hasattr(model.model.layers[10].self_attn.q_proj, "base_layer")


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("fused", [False, True], ids=["per-expert-base", "fused-base"])
@pytest.mark.parametrize("down", [True, False], ids=["down-everywhere", "no-down"])
def test_fused_parameters_wrapped_on_one_layer_route_right(tmp_path, fused, down, family):
    """gate_up_proj wrapped on layer 1 only: with down_proj wrapped on every layer, both
    sit two base_layers deep there and one elsewhere; else layer 1's one deep, the other
    layers' not wrapped at all. (qwen2_moe: its converters' targets are ``mlp.experts.…``,
    no leading dot.)"""
    config = peft.LoraConfig(r=2, lora_alpha=4, init_lora_weights=False,
                             target_modules=["q_proj"], target_parameters=[
                                 "layers.1.mlp.experts.gate_up_proj", *(["down_proj"] * down)])
    model = _layer_specific(tmp_path, family, config, fused=fused)
    inner = model.model.layers[1].mlp.experts.base_layer
    assert (inner.base_layer if down else inner).gate_up_proj is not None
    assert hasattr(model.model.layers[2].mlp.experts, "base_layer") is down


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_a_scoped_converter_over_fused_parameters_at_two_depths_is_anchored_in_its_scope(
        tmp_path, family):
    """The base mapping scoped to ``model`` (as a user's ``scope_prefix``, or a text model's
    mapping inside a composite): its sources are searched below ``model.``, so the per-depth
    converters are anchored to the holders' paths below it (were anchored to the whole
    paths and matched nothing: every layer's gate_up_proj was unexpected, its base_layer
    tensors missing)."""
    config = peft.LoraConfig(r=2, lora_alpha=4, init_lora_weights=False,
                             target_modules=["q_proj"], target_parameters=[
                                 "layers.1.mlp.experts.gate_up_proj", "down_proj"])
    scoped = [t.with_scope("model") for t in weightplan.get_mapping(family)]
    model = _layer_specific(tmp_path, family, config, layers=3, mapping=scoped)
    assert model.model.layers[1].mlp.experts.base_layer.base_layer.gate_up_proj is not None


def test_path_alternatives_leave_a_leading_zero_module_out():
    """A module numbered with a leading zero (a ModuleDict's ``"01"``) has no template, but a
    ``\\d\\d`` pattern matches it: the paths of its length are not all the modules then."""
    modules = {"", "h", "h.01", "h.10", "h.11"}
    regex = re.compile(rf"^(?:{path_alternatives({'h.10', 'h.11'}, frozenset(modules))})$")
    assert {m for m in modules if regex.match(m)} == {"h.10", "h.11"}
