"""``from_pretrained`` reads each file once per call: ``config.json`` (building the model,
choosing its dtype, testing for FP8, and the plan all use what was read), and the
checkpoint's headers (the dtype of a config naming none came from them: the plan takes
those headers as read). Opens are counted by ``opens`` (tests/conftest.py: an audit hook)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch

import weightplan
from weightplan.planner.inputs import checkpoint as checkpoint_module

from tests.interop.matrix import FAMILIES


@pytest.fixture
def header_reads(monkeypatch):
    """The safetensors headers read, by file name."""
    reads: Counter = Counter()
    original = checkpoint_module._read_raw

    def counted(path: str):
        reads[os.path.basename(path)] += 1
        return original(path)

    monkeypatch.setattr(checkpoint_module, "_read_raw", counted)
    return reads


def _saved(tmp_path, *, config_dtype: bool):
    cls, cfg, _ = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    if not config_dtype:
        path = tmp_path / "config.json"
        words = json.loads(path.read_text())
        words.pop("dtype", None)
        words.pop("torch_dtype", None)
        path.write_text(json.dumps(words))
    return tmp_path


@pytest.mark.parametrize("config_dtype", [True, False])
def test_from_pretrained_reads_config_json_and_the_headers_once(tmp_path, opens,
                                                                 header_reads, config_dtype):
    directory = _saved(tmp_path, config_dtype=config_dtype)
    with opens() as opened:
        model = weightplan.from_pretrained(directory)
    assert opened["config.json"] == 1, opened
    assert header_reads == {"model.safetensors": 1}
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16  # (the checkpoint's)


def _config(directory):
    """The config ``build_empty_model`` builds the model from (before the model's own
    ``__init__`` changes it)."""
    import transformers

    from weightplan.bridge import hub

    return hub._read_config(transformers, directory / "config.json", None)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_config_built_from_what_was_read_is_transformers_own(family, tmp_path):
    """The config is made from the dict weightplan read (transformers doesn't read the file
    again): it equals ``AutoConfig.from_pretrained``'s, attribute for attribute."""
    import transformers

    cls, cfg, _ = FAMILIES[family]()
    cfg.save_pretrained(tmp_path)
    ours = _config(tmp_path)
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(ours) is type(theirs)
    assert ours.to_dict() == theirs.to_dict()
    assert ours.name_or_path == theirs.name_or_path


def test_a_mistral_config_with_layer_types_is_ministral_as_transformers_reads_it(tmp_path):
    import transformers

    transformers.MistralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                               head_dim=8).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "layer_types": ["full_attention"] * 2}))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = _config(tmp_path)
    assert type(ours) is type(theirs) and theirs.model_type == "ministral"
    assert ours.to_dict() == theirs.to_dict()


def test_a_config_with_an_infinite_float_is_read_as_transformers_reads_it(tmp_path):
    """transformers 5 writes inf as ``{"__float__": "Infinity"}`` (Mamba2's
    ``time_step_limit``) and decodes it when it reads the file: the config made from the
    dict weightplan read decodes it too (was: ModelBuildError, 'time_step_limit … doesn't
    match any type', so from_pretrained of any Mamba2 saved by transformers 5 failed)."""
    import transformers

    transformers.Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_heads=4,
                              head_dim=16, state_size=8, n_groups=1).save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = _config(tmp_path)
    assert tuple(ours.time_step_limit) == (0.0, float("inf"))
    assert type(ours) is type(theirs) and ours.to_dict() == theirs.to_dict()
