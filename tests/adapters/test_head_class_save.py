"""A LoRA adapter loaded onto a model built under another head class than its file's
(``model_class=LlamaModel`` for a LlamaForCausalLM adapter, and back) saves under the
loaded model's own names, as peft's ``save_pretrained`` of that model writes them (was: the
file's, ``base_model.model.model.layers.*`` from a LlamaModel, which peft then loads as an
adapter with every key missing)."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

import weightplan
from tests.interop.test_save_keys import LLAMA, MIXTRAL  # (the same tiny configs)

peft = pytest.importorskip("peft")

HEADS = [(T.LlamaForCausalLM, T.LlamaModel, LLAMA), (T.LlamaModel, T.LlamaForCausalLM, LLAMA),
         (T.MixtralForCausalLM, T.MixtralModel, MIXTRAL)]


def _lora():
    return peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                           init_lora_weights=False)


@pytest.mark.parametrize("stored, loaded, cfg", HEADS, ids=lambda x: getattr(x, "__name__", ""))
def test_an_adapter_loaded_under_another_head_class_saves_its_own_names(stored, loaded, cfg,
                                                                        tmp_path):
    torch.manual_seed(0)
    stored(cfg).save_pretrained(tmp_path / "base")
    peft.get_peft_model(stored(cfg), _lora()).save_pretrained(tmp_path / "lora")
    peft.get_peft_model(loaded(cfg), _lora()).save_pretrained(tmp_path / "theirs")
    model = weightplan.from_pretrained(tmp_path / "base", adapter=tmp_path / "lora",
                                       model_class=loaded, dtype=torch.float32, progress=False)
    weightplan.save(model, tmp_path / "mine", adapter_name="default", progress=False)
    mine = load_file(tmp_path / "mine" / "adapter_model.safetensors")
    assert mine.keys() == load_file(tmp_path / "theirs" / "adapter_model.safetensors").keys()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # (peft warns of missing adapter keys)
        back = peft.PeftModel.from_pretrained(loaded(cfg), tmp_path / "mine")
    ours = {k: v for k, v in model.state_dict().items() if ".lora_" in k}
    theirs = {k.removeprefix("base_model.model."): v for k, v in back.state_dict().items()
              if ".lora_" in k}
    assert ours.keys() == theirs.keys() and ours
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
