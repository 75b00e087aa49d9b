"""Fixtures shared by the from_pretrained interop tests."""

import pytest
import torch

from tests.interop.matrix import FAMILIES


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama saved by transformers' ``save_pretrained``: (directory, class, inputs)."""
    directory = tmp_path_factory.mktemp("llama")
    cls, cfg, inputs = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(directory)
    return directory, cls, inputs


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """transformers' save_pretrained(variant=...): fp16 sharded (model.fp16-0000i-of-00002
    + model.safetensors.index.fp16.json), bf16 one file, nothing plain."""
    directory = tmp_path_factory.mktemp("variants")
    cls, cfg, inputs = FAMILIES["llama"]()
    torch.manual_seed(0)
    model = cls(cfg)
    model.to(torch.float16).save_pretrained(directory, variant="fp16", max_shard_size="40KB")
    model.to(torch.bfloat16).save_pretrained(directory, variant="bf16")
    assert (directory / "model.safetensors.index.fp16.json").is_file()
    assert not (directory / "model.safetensors").exists()
    return directory, cls, inputs
