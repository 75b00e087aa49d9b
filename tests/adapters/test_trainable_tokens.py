"""peft's trainable tokens (``trainable_token_indices``, beside LoRA): injected by peft,
the ``trainable_tokens_delta`` rows loaded through the plan, the base's rows
(``trainable_tokens_original``, a non-persistent buffer) copied from the loaded base
weight; the model equals ``PeftModel.from_pretrained``'s (tensors, buffers, logits) and
saves back to the same file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from weightplan.api.adapters import explain_with_adapter
from weightplan.bridge.hub import build_empty_model
from weightplan.errors import AdapterError

from tests.adapters.builders import PREFIX, tiny_config

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[1, 5, 9, 63, 0]])
LAYOUT = ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
          "model.rotary_emb", "lm_head")


def _llama(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_config("llama")
    config.tie_word_embeddings = tied
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _trained(root, tied, indices):
    """A base and an adapter (LoRA on q_proj + trainable tokens) whose tensors moved."""
    _llama(tied).save_pretrained(root / "base")
    model = peft.get_peft_model(_llama(tied), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], trainable_token_indices=indices,
        init_lora_weights=False))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g))
    model.save_pretrained(str(root / "lora"))
    return root / "base", root / "lora"


def _peft(base, lora, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    return peft.PeftModel.from_pretrained(model, str(lora)).eval()


@pytest.mark.parametrize("tied,indices,dtype", [
    (False, [1, 5], torch.float32),
    (True, [1, 5], torch.float32),
    (False, [1, 5], torch.bfloat16),
    (False, {"embed_tokens": [1, 5], "lm_head": [2, 3, 7]}, torch.float32),
])
def test_trainable_tokens_load_as_peft_loads_them(tmp_path, tied, indices, dtype):
    base, lora = _trained(tmp_path, tied, indices)
    theirs = _peft(base, lora, dtype)
    ours = weightplan.from_pretrained(base, adapter=lora, dtype=dtype)
    a = ours.state_dict()
    b = {k.removeprefix(PREFIX): v for k, v in theirs.state_dict().items()}
    assert sorted(a) == sorted(b)
    assert any("trainable_tokens_delta" in k for k in a)
    assert [k for k in a if not (torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype)] == []
    buffers = {k.removeprefix(PREFIX): v for k, v in theirs.named_buffers()}
    mine = dict(ours.named_buffers())
    originals = [k for k in buffers if "trainable_tokens_original" in k]
    assert originals and all(torch.equal(mine[k], buffers[k]) for k in originals)
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, theirs(IDS).logits)
    weightplan.save(ours, tmp_path / "saved", adapter_name="default")
    written = load_file(str(tmp_path / "saved" / "adapter_model.safetensors"))
    trained = load_file(str(lora / "adapter_model.safetensors"))
    assert sorted(written) == sorted(trained)
    assert all(torch.equal(written[k], v) and written[k].dtype == v.dtype
               for k, v in trained.items())
    config = json.loads((tmp_path / "saved" / "adapter_config.json").read_text())
    assert config["trainable_token_indices"] == indices


def test_the_plan_says_the_original_rows_are_filled_after_the_load(tmp_path):
    base, lora = _trained(tmp_path, False, [1, 5])
    plan = explain_with_adapter(build_empty_model(base).model, base, lora)
    assert not plan.problems
    original = "model.embed_tokens.token_adapter.trainable_tokens_original.default"
    assert any(n.key == original and "rows [1, 5]" in n.message for n in plan.notes)
    assert [t.rows for t in plan.adapter.tokens] == [(1, 5)]
    assert ("trainable tokens: rows [1, 5] of model.embed_tokens.token_adapter.base_layer.weight"
            in str(plan))
    assert list(plan.to_dict()["adapter"]["tokens"][0]["rows"]) == [1, 5]


@pytest.mark.parametrize("tied,on_disk", [
    (False, ("model.embed_tokens",)),
    (True, ("model.embed_tokens",)),
    (True, ("lm_head",)),  # (was: no problem, then accelerate's dispatch failed the load)
    (True, ("model.embed_tokens", "lm_head")),
])
def test_trainable_tokens_on_the_disk_are_refused_at_plan_time(tmp_path, tied, on_disk):
    """transformers + peft fail there (at the forward, or transformers' own dispatch of a
    tie split between memory and the disk): refused when planned, naming the adapter's
    config, the tensor and what to place where."""
    base, lora = _trained(tmp_path, tied, [1, 5])
    disk = {m: "disk" if m in on_disk else "cpu" for m in LAYOUT}
    with pytest.raises(AdapterError, match=rf"adapter_config.json \[trainable_token_indices\]: "
                       rf"{on_disk[0]}\.token_adapter\.base_layer\.weight.*placed on the disk.*place "
                       rf"{'lm_head and ' if tied else ''}model.embed_tokens on a device"):
        explain_with_adapter(build_empty_model(base).model, base, lora, device=disk,
                             offload_folder=str(tmp_path / "off"))
    with pytest.raises(AdapterError, match=str(lora / "adapter_config.json")):
        weightplan.from_pretrained(base, adapter=lora, device_map="auto", max_memory={"cpu": 0},
                                   offload_folder=str(tmp_path / "off"))


@pytest.mark.parametrize("tied", [False, True])
def test_trainable_tokens_run_with_other_modules_on_the_disk(tmp_path, tied):
    base, lora = _trained(tmp_path, tied, [1, 5])
    expected = _peft(base, lora)(IDS).logits
    layer = {m: "disk" if m == "model.layers.0" else "cpu" for m in LAYOUT}
    model = weightplan.from_pretrained(base, adapter=lora, device_map=layer,
                                       offload_folder=str(tmp_path / "off"))
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, expected)


def test_trainable_tokens_are_not_merged(tmp_path):
    base, lora = _trained(tmp_path, False, [1, 5])
    with pytest.raises(AdapterError, match="trainable_token_indices.*without merge=True"):
        weightplan.from_pretrained(base, adapter=lora, merge=True)


def test_trainable_tokens_load_into_a_peft_model(tmp_path):
    base, lora = _trained(tmp_path, False, [1, 5])
    model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(base),
                                peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                                trainable_token_indices=[1, 5])).eval()
    plan = weightplan.explain(model, lora)
    assert not plan.problems
    plan.execute()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, _peft(base, lora)(IDS).logits)


def test_a_placement_for_an_adapter_alone_is_refused(tmp_path):
    """An adapter alone into a model with it injected loads where its layers' base weights
    are (was: device_map=, max_memory=, offload_folder= silently ignored)."""
    from weightplan.errors import ArgumentError

    base, lora = _trained(tmp_path, True, [1, 5])
    with weightplan.init_empty():
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(base))
    model = peft.get_peft_model(model, peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], trainable_token_indices=[1, 5]))
    disk = {m: "disk" if m == "model.embed_tokens" else "cpu" for m in LAYOUT}
    for words in ({"device_map": disk, "offload_folder": str(tmp_path / "off")},
                  {"device_map": "auto", "max_memory": {"cpu": 0}}):
        with pytest.raises(ArgumentError, match="from_pretrained\\(BASE, adapter=ADAPTER_DIR, device_map"):
            weightplan.explain(model, lora, **words)
