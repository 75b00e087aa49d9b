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
