"""Every way people build an empty model loads exactly like ``from_pretrained``: ties
declared by the model stay tied, meta buffers are rebuilt by the model's own init, missing
tensors get that init too, ignorable keys are notes; ``save`` → ``from_pretrained`` gives
the model back. One checkpoint and reference per family, shared by the module."""

import pytest
import torch
from torch import nn

import weightplan
from weightplan.errors import MetaBufferError
from weightplan.planner.inputs.model_info import declared_ties

from tests.interop.matrix import BUILDS, FAMILIES, Saved, build, output, pretrained
from tests.interop.oracle import rewrite


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root, cache = tmp_path_factory.mktemp("families"), {}

    def get(name: str) -> Saved:
        if name not in cache:
            cache[name] = Saved(name, root)
        return cache[name]
    return get


def assert_like_reference(model, s: Saved) -> None:
    expected, got = s.reference.state_dict(), model.state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    for name, buffer in s.reference.named_buffers():
        assert torch.equal(model.get_buffer(name), buffer), name
    assert torch.equal(output(model, s.inputs), s.expected)


@pytest.mark.parametrize("convention", BUILDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_build_convention_loads_like_from_pretrained(family, convention, saved):
    s = saved(family)
    model = build(s.cls, s.cfg, convention)
    plan = weightplan.explain(model, s.directory)
    assert not plan.problems and not plan.missing and not plan.unexpected, str(plan)
    plan.execute(strict=True)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    for target, source in declared_ties(model).items():  # one tensor, two names
        assert model.get_parameter(target) is model.get_parameter(source), target
    assert_like_reference(model, s)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_then_from_pretrained_gives_the_model_back(family, saved, tmp_path):
    s = saved(family)
    model = build(s.cls, s.cfg, "meta")
    weightplan.load(model, s.directory)
    weightplan.save(model, tmp_path)
    assert (tmp_path / "config.json").is_file()
    back = pretrained(s.cls, tmp_path)  # the saved config, not ours
    assert back.config.to_dict() == {**s.reference.config.to_dict(),
                                     "_name_or_path": str(tmp_path)}
    assert_like_reference(back, s)


def test_a_model_loaded_by_transformers_saves_and_comes_back(saved, tmp_path):
    s = saved("llava")  # its mapping has PrefixChanges: left out without a load record
    weightplan.save(s.reference, tmp_path)
    assert_like_reference(pretrained(s.cls, tmp_path), s)


def test_legacy_gamma_beta_loads_under_every_convention(saved, tmp_path):
    s = saved("bert")
    legacy = rewrite(s.directory, tmp_path, lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma")
                     .replace("LayerNorm.bias", "LayerNorm.beta"))
    for convention in BUILDS:
        model = build(s.cls, s.cfg, convention)
        weightplan.load(model, legacy, strict=True)
        assert_like_reference(model, s)


def test_missing_tensors_get_the_models_own_init(saved, tmp_path, caplog):
    s = saved("llama")
    gone = ("model.norm.weight", "lm_head.weight")
    partial = rewrite(s.directory, tmp_path, change=lambda k, v: v)
    from safetensors.torch import load_file, save_file
    tensors = {k: v for k, v in load_file(str(partial / "model.safetensors")).items()
               if k not in gone}
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    model = build(s.cls, s.cfg, "meta")
    plan = weightplan.explain(model, partial)
    assert plan.missing == set(gone)
    with caplog.at_level("WARNING", logger="weightplan"):
        report = plan.execute()
    assert "2 missing tensors" in caplog.text
    assert report.initialized == {"model.norm.weight": "LlamaModel._init_weights()",
                                  "lm_head.weight": "LlamaForCausalLM._init_weights()"}
    assert torch.equal(model.model.norm.weight, torch.ones(32))
    assert 0.015 < model.lm_head.weight.std().item() < 0.025  # initializer_range 0.02
    assert torch.equal(model.model.embed_tokens.weight, s.reference.model.embed_tokens.weight)


def test_keys_the_model_declares_ignorable_are_notes(saved, tmp_path):
    s = saved("deepseek_v3")  # declares model.layers.61.* (the MTP layer) ignorable
    extra = {"model.layers.61.eh_proj.weight": torch.zeros(32, 64),
             "model.layers.61.enorm.weight": torch.ones(32)}
    from safetensors.torch import load_file, save_file
    tensors = {**load_file(str(s.directory / "model.safetensors")), **extra}
    rewrite(s.directory, tmp_path)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = build(s.cls, s.cfg, "accelerate")
    plan = weightplan.explain(model, tmp_path)
    assert not plan.problems and not plan.unexpected, str(plan)
    assert {n.key for n in plan.notes if "declares it ignorable" in n.message} == set(extra)
    plan.execute(strict=True)
    assert_like_reference(model, s)


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("freq", torch.arange(4.0), persistent=False)


def test_meta_buffers_nothing_can_rebuild_are_refused(tmp_path):
    state = {k: v.clone() for k, v in Rotary().state_dict().items()}
    with torch.device("meta"):
        model = Rotary()
    plan = weightplan.explain(model, state)
    (problem,) = plan.problems
    assert (problem.kind.value, problem.key) == ("meta buffer", "freq")
    with pytest.raises(MetaBufferError, match="freq"):
        plan.execute()
    assert model.proj.weight.is_meta  # nothing was loaded
    with weightplan.init_empty():
        model = Rotary()
    weightplan.load(model, state, strict=True)
    assert torch.equal(model.freq, torch.arange(4.0))
