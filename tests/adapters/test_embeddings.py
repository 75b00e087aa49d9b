"""An embedding saved with the adapter (peft's ``save_embedding_layers``, on by default when
``embed_tokens`` is a target): the adapter file's base-layer tensor replaces the base's, as
``PeftModel.from_pretrained`` loads it; the base's is not read."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import weightplan
from weightplan.api.adapters import explain_with_adapter
from weightplan.bridge.hub import build_empty_model
from weightplan.errors import ConflictingTransformError
from weightplan.planner.pipelines.adapter_summary import Replacement

from tests.adapters.builders import PREFIX, tiny_config

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

EMBED = "model.embed_tokens"
IDS = torch.tensor([[1, 5, 9, 63, 0]])


def _llama(seed, tied=False, vocab=None):
    torch.manual_seed(seed)
    config = tiny_config("llama")
    config.tie_word_embeddings = tied
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if vocab is not None:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    return model


def _adapter(root, targets, tied=False, vocab=None, **save):
    """A base (seed 0) and a LoRA trained on another copy (seed 1: its embedding differs;
    ``vocab``: resized first)."""
    _llama(0, tied).save_pretrained(root / "base")
    lora = peft.get_peft_model(_llama(1, tied, vocab), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=targets, init_lora_weights=False))
    lora.save_pretrained(str(root / "lora"), **save)
    with safe_open(str(root / "lora" / "adapter_model.safetensors"), "pt") as f:
        return sorted(f.keys())


def _peft(root, merge=False, vocab=None):
    base = transformers.AutoModelForCausalLM.from_pretrained(root / "base")
    if vocab is not None:
        base.resize_token_embeddings(vocab, mean_resizing=False)
    model = peft.PeftModel.from_pretrained(base, str(root / "lora")).eval()
    return model.merge_and_unload() if merge else model


def _same(ours, theirs):
    a = ours.state_dict()
    b = {k.removeprefix(PREFIX): v for k, v in theirs.state_dict().items()}
    assert sorted(a) == sorted(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, theirs(IDS).logits)


@pytest.mark.parametrize("tied", [False, True])
def test_an_embedding_saved_with_the_adapter_replaces_the_base_one(tmp_path, tied):
    keys = _adapter(tmp_path, ["embed_tokens", "q_proj"], tied)
    saved = f"{PREFIX}{EMBED}.base_layer.weight"
    assert saved in keys  # (peft turned save_embedding_layers on)
    plan = explain_with_adapter(build_empty_model(tmp_path / "base").model,
                                tmp_path / "base", tmp_path / "lora")
    assert not plan.problems
    assert plan.adapter.replaced == (
        Replacement(f"{EMBED}.base_layer.weight", saved, f"{EMBED}.weight"),)
    assert f"{EMBED}.weight" not in {e.key for c in plan.conversions for e in c.group.entries}
    assert (f"{EMBED}.base_layer.weight from the adapter file, {saved} (replaces the base's "
            f"{EMBED}.weight: not read)") in str(plan)
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora")
    base = load_file(str(tmp_path / "base" / "model.safetensors"))[f"{EMBED}.weight"]
    assert not torch.equal(model.get_parameter(f"{EMBED}.base_layer.weight"), base)
    _same(model, _peft(tmp_path))


def test_a_resized_vocabulary_loads_into_a_model_resized_as_for_peft(tmp_path):
    """Tied embeddings (an untied ``lm_head``'s new rows are saved nowhere): the model
    resized by the caller, as peft's base must be; the base's smaller one is not read."""
    _adapter(tmp_path, ["embed_tokens", "q_proj"], tied=True, vocab=70)
    model = build_empty_model(tmp_path / "base").model
    model.resize_token_embeddings(70, mean_resizing=False)
    plan = explain_with_adapter(model, tmp_path / "base", tmp_path / "lora")
    assert not plan.problems and len(plan.adapter.replaced) == 1
    plan.execute()
    _same(model, _peft(tmp_path, vocab=70))
    assert model.lm_head.weight is model.get_parameter(f"{EMBED}.base_layer.weight")


@pytest.mark.parametrize("tied", [False, True])
def test_merged_into_the_adapters_embedding(tmp_path, tied):
    _adapter(tmp_path, ["embed_tokens", "q_proj"], tied)
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora", merge=True)
    assert not any("lora" in n for n, _ in model.named_parameters())
    _same(model, _peft(tmp_path, merge=True))


def test_embeddings_saved_beside_an_adapter_on_other_layers(tmp_path):
    """``save_embedding_layers=True`` without an embedding target: plain ``embed_tokens``
    and ``lm_head`` keys, both replacing the base's."""
    keys = _adapter(tmp_path, ["q_proj"], save_embedding_layers=True)
    assert {f"{PREFIX}{EMBED}.weight", f"{PREFIX}lm_head.weight"} <= set(keys)
    plan = explain_with_adapter(build_empty_model(tmp_path / "base").model,
                                tmp_path / "base", tmp_path / "lora")
    assert not plan.problems
    assert sorted(r.target for r in plan.adapter.replaced) == ["lm_head.weight",
                                                               f"{EMBED}.weight"]
    _same(weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora"),
          _peft(tmp_path))


def test_two_sources_in_one_file_still_conflict(tmp_path):
    _adapter(tmp_path, ["embed_tokens", "q_proj"])
    adapter = tmp_path / "lora" / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    twice = dict(tensors, **{f"{PREFIX}{EMBED}.weight":
                             tensors[f"{PREFIX}{EMBED}.base_layer.weight"].clone()})
    save_file(twice, str(adapter))
    with pytest.raises(ConflictingTransformError, match="two checkpoint sources"):
        weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora")
    save_file(tensors, str(adapter))
    base = tmp_path / "base" / "model.safetensors"
    weights = load_file(str(base))
    save_file(dict(weights, **{f"{EMBED}.base_layer.weight": weights[f"{EMBED}.weight"] + 1}),
              str(base), metadata={"format": "pt"})
    with pytest.raises(ConflictingTransformError, match="two checkpoint sources"):
        weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora")


def test_saved_back_with_its_embedding(tmp_path):
    """``save(model, dir, adapter_name=)`` writes the file as it was, the embedding saved
    with the adapter included (else loading it back would give the base's), in the layout
    it was loaded from or one chosen; merged, the base's layout with the merged embedding."""
    _adapter(tmp_path, ["embed_tokens", "q_proj"])
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora")
    file = "adapter_model.safetensors"
    before = load_file(str(tmp_path / "lora" / file))
    for layout in (None, "fused"):  # (as loaded; in a layout chosen: peft's rule)
        weightplan.save(model, tmp_path / str(layout), adapter_name="default", layout=layout)
        after = load_file(str(tmp_path / str(layout) / file))
        assert sorted(after) == sorted(before)
        assert [k for k in before if not torch.equal(before[k], after[k])] == []
    merged = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora", merge=True)
    weightplan.save(merged, tmp_path / "merged")
    written = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert sorted(written) == sorted(load_file(str(tmp_path / "base" / "model.safetensors")))
    assert torch.equal(written[f"{EMBED}.weight"], merged.get_parameter(f"{EMBED}.weight"))
