"""``from_pretrained(BASE, adapter="org/lora")``: an adapter named by a Hub repo id is found
as the base's repo id is (the cache in ``cache_dir``, ``HF_HUB_OFFLINE`` /
``local_files_only``, ``token``; ``adapter_revision=``: its revision), as peft's
``PeftModel.from_pretrained(model, "org/lora")`` finds it (was: ``AdapterError``: not an
adapter directory). The cache is laid out by hand with huggingface_hub's naming: no network."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers as T

import weightplan
from weightplan.errors import ArgumentError, CheckpointError

from tests.interop.matrix import FAMILIES, output, pretrained
from tests.interop.test_from_pretrained import cached_repo

peft = pytest.importorskip("peft")
IDS = {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])}
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A base directory, and a cache holding the adapter ``tiny-org/lora`` at ``main`` (and an
    older revision ``OTHER`` with other factors)."""
    root = tmp_path_factory.mktemp("hub")
    cls, cfg, _ = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(root / "base")
    for seed, name in ((1, "lora"), (2, "older")):
        torch.manual_seed(seed)
        peft.get_peft_model(cls(cfg), peft.LoraConfig(
            r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
        )).save_pretrained(root / name)
    cached_repo(root / "cache", "tiny-org/lora", root / "lora")  # (main: COMMIT)
    shutil.copytree(root / "older", root / "cache" / "models--tiny-org--lora" / "snapshots" / OTHER)
    return root


def _peft(base, adapter, **kwargs):
    return peft.PeftModel.from_pretrained(pretrained(T.AutoModelForCausalLM, base), adapter,
                                          **kwargs).eval()


def test_an_adapter_repo_id_loads_from_the_cache_as_peft_loads_it(hub, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (read at import)
    cache = str(hub / "cache")
    theirs = _peft(hub / "base", "tiny-org/lora", cache_dir=cache)
    model = weightplan.from_pretrained(hub / "base", adapter="tiny-org/lora", cache_dir=cache)
    mine = model.state_dict()
    their = {k.removeprefix("base_model.model."): v for k, v in theirs.state_dict().items()}
    assert any("lora_A.default" in k for k in mine) and mine.keys() == their.keys()
    assert [k for k in mine if not torch.equal(mine[k], their[k])] == []
    assert torch.equal(output(model, IDS), output(theirs, IDS))
    older = _peft(hub / "base", "tiny-org/lora", cache_dir=cache, revision=OTHER)
    model = weightplan.from_pretrained(hub / "base", adapter="tiny-org/lora", cache_dir=cache,
                                       adapter_revision=OTHER)
    assert torch.equal(output(model, IDS), output(older, IDS))
    assert not torch.equal(output(older, IDS), output(theirs, IDS))


def test_an_adapter_repo_id_not_cached_offline_is_refused_saying_so(hub, tmp_path):
    with pytest.raises(CheckpointError, match="tiny-org/other.*local_files_only=True"):
        weightplan.from_pretrained(hub / "base", adapter="tiny-org/other", cache_dir=tmp_path,
                                   local_files_only=True)
    with pytest.raises(ArgumentError, match="adapter_revision="):
        weightplan.from_pretrained(hub / "base", adapter_revision=OTHER)


def test_an_adapter_revision_not_cached_offline_names_the_revision(hub):
    """Was: 'tiny-org/lora ... not in the local cache ... (hf download tiny-org/lora)' while
    the cache holds it at main: the revision asked was not said, and the command given
    fetches main."""
    with pytest.raises(CheckpointError, match=r"tiny-org/lora.*not in the local cache at "
                                              r"revision 'v9'.*hf download tiny-org/lora "
                                              r"--revision v9"):
        weightplan.from_pretrained(hub / "base", adapter="tiny-org/lora",
                                   cache_dir=str(hub / "cache"), adapter_revision="v9",
                                   local_files_only=True)
