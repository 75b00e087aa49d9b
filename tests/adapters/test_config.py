"""Recognising an adapter directory: LoRA's fields read, everything else refused by name."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import save_file

from weightplan.errors import AdapterError, WeightplanError
from weightplan.planner.inputs.adapter import is_adapter_dir, read_adapter

from tests.adapters.builders import write_config


def _adapter(tmp_path, **fields) -> str:
    d = str(tmp_path)
    save_file({"base_model.model.x.lora_A.weight": torch.zeros(2, 4)},
              os.path.join(d, "adapter_model.safetensors"))
    write_config(d, **fields)
    return d


def test_lora_fields_are_read(tmp_path):
    d = _adapter(tmp_path, r=8, lora_alpha=16, use_rslora=True, use_dora=True,
                 target_modules=["q_proj", "w1"], target_parameters=["gate_up_proj"],
                 rank_pattern={"q_proj": 4}, alpha_pattern={r".*\.w1": 2},
                 modules_to_save=["lm_head"])
    assert is_adapter_dir(d)
    config = read_adapter(d).config
    assert (config.r, config.lora_alpha, config.use_rslora, config.use_dora) == (8, 16, True, True)
    assert config.target_modules == ("q_proj", "w1")
    assert config.target_parameters == ("gate_up_proj",)
    assert config.modules_to_save == ("lm_head",)
    assert config.rank_alpha("model.layers.0.self_attn.q_proj") == (4, 16)
    assert config.rank_alpha("model.layers.0.experts.3.w1") == (8, 2)
    assert config.rank_alpha("model.layers.0.self_attn.k_proj") == (8, 16)
    assert config.scale("k_proj") == pytest.approx(16 / math.sqrt(8))  # rsLoRA: alpha/√r


def test_plain_scale_is_alpha_over_r(tmp_path):
    config = read_adapter(_adapter(tmp_path, r=4, lora_alpha=8)).config
    assert config.scale("anything") == 2.0


@pytest.mark.parametrize("peft_type", ["IA3", "PREFIX_TUNING", "LOHA"])
def test_other_peft_types_are_refused_by_name(tmp_path, peft_type):
    d = _adapter(tmp_path, peft_type=peft_type)
    with pytest.raises(AdapterError, match=peft_type) as e:
        read_adapter(d)
    assert "adapter_config.json" in str(e.value)


def test_missing_config_names_the_file(tmp_path):
    with pytest.raises(AdapterError, match="adapter_config.json.*not found"):
        read_adapter(tmp_path)


@pytest.mark.parametrize("text, field", [
    ("{not json", "adapter config"),
    ("[1, 2]", "not a JSON object"),
    ('{"peft_type": "LORA", "r": -2}', "r must be a positive number"),
    ('{"peft_type": "LORA", "r": 4, "rank_pattern": {"q": "x"}}', "rank_pattern"),
    ('{"peft_type": "LORA", "target_modules": [1]}', "target_modules"),
    ('{"r": 4}', "no peft_type"),
])
def test_malformed_config_names_file_and_field(tmp_path, text, field):
    d = _adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(text)
    with pytest.raises(AdapterError, match=field) as e:
        read_adapter(d)
    assert str(tmp_path / "adapter_config.json") in str(e.value)


def test_pickled_weights_are_never_read(tmp_path):
    write_config(str(tmp_path))
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04not read")
    with pytest.raises(AdapterError, match="pickle"):
        read_adapter(tmp_path)


def test_adapter_errors_are_weightplan_errors():
    assert issubclass(AdapterError, WeightplanError)


def test_config_written_by_peft_is_read(tmp_path):
    from peft import LoraConfig

    LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_rslora=True).save_pretrained(
        str(tmp_path))
    save_file({"k": torch.zeros(1)}, str(tmp_path / "adapter_model.safetensors"))
    config = read_adapter(tmp_path).config
    assert (config.r, config.lora_alpha, config.use_rslora) == (4, 8, True)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["peft_type"] == "LORA"
