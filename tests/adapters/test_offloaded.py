"""An adapter loaded with part of the model on the disk (``device_map`` naming ``"disk"``):
accelerate's hooks bring each offloaded adapter layer's weights back at its forward, its
whole subtree at once (a DoRA layer reads its base weight and factors outside their own
forwards, a LoRA embedding its ``ParameterDict``), and the logits equal peft's on the
model loaded in memory."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from weightplan.bridge.offload import adapter_layer_classes

from tests.adapters.builders import MIXTRAL, per_expert_adapter, tiny_model

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

IDS = torch.tensor([[1, 5, 9, 63, 0]])
LAYOUT = ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
          "model.rotary_emb", "lm_head")


def _map(*disk: str) -> dict[str, str]:
    return {m: "disk" if m in disk else "cpu" for m in LAYOUT}


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("targets,dora", [
    (["q_proj", "v_proj"], True),
    (["embed_tokens", "q_proj"], False),
    (["embed_tokens", "q_proj"], True),
])
@pytest.mark.parametrize("disk", [("model.layers.0",), ("model.embed_tokens", "model.layers.1")])
def test_an_offloaded_adapter_runs_with_peft_s_logits(tmp_path, targets, dora, disk):
    tiny_model("llama").save_pretrained(tmp_path / "base")
    trained = peft.get_peft_model(tiny_model("llama", seed=1), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=targets, use_dora=dora, init_lora_weights=False))
    trained.save_pretrained(str(tmp_path / "lora"))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    expected = _logits(peft.PeftModel.from_pretrained(base, str(tmp_path / "lora")).eval())
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora",
                                       device_map=_map(*disk),
                                       offload_folder=str(tmp_path / "off"))
    offloaded = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    assert any(".lora_" in n for n in offloaded), offloaded  # (the adapter's too)
    assert torch.equal(_logits(model), expected)
    assert {"Linear"} <= set(adapter_layer_classes(model))
    _saves_back(model, tmp_path)  # (was: SaveError "7 adapter tensor(s) are on meta")


def _saves_back(model: torch.nn.Module, tmp_path) -> None:
    """The adapter saved from the offloaded model (its offloaded tensors read from their
    files) is the trained file, bit for bit."""
    weightplan.save(model, tmp_path / "saved", adapter_name="default")
    written = load_file(str(tmp_path / "saved" / "adapter_model.safetensors"))
    trained = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    assert sorted(written) == sorted(trained)
    assert [k for k, v in trained.items()
            if not (torch.equal(written[k], v) and written[k].dtype == v.dtype)] == []


def test_offloaded_fused_expert_loras_run(tmp_path):
    tiny_model("mixtral").save_pretrained(tmp_path / "base")
    per_expert_adapter(str(tmp_path / "lora"), MIXTRAL)
    expected = _logits(weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora"))
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora",
                                       device_map=_map("model.layers.0"),
                                       offload_folder=str(tmp_path / "off"))
    assert torch.equal(_logits(model), expected)
    _saves_back(model, tmp_path)


def test_a_model_without_adapters_preloads_nothing():
    assert adapter_layer_classes(tiny_model("llama")) == []
