"""``explain`` / ``load`` / ``explain_with_adapter`` read local checkpoints (SPEC §1: a file,
a directory, files, a dict); a Hugging Face repo id given there, even one in the cache, is
refused with a CheckpointError naming it and the two ways to load it
(``weightplan.from_pretrained``, ``huggingface_hub.snapshot_download``), which work
(was: ``org/name: file not found``). The cache is laid out by hand: no network."""

from __future__ import annotations

import pytest
import torch

import weightplan
from weightplan.api.adapters import explain_with_adapter
from weightplan.errors import CheckpointError

from tests.interop.matrix import FAMILIES
from tests.interop.test_from_pretrained import cached_repo

REPO = "tiny-org/llama"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    cls, cfg, _ = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(root / "base")
    cached_repo(root / "cache", REPO, root / "base")
    return cls, cfg, root


@pytest.fixture
def offline(hub, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (read at import)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub[2] / "cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub[2] / "cache"))
    monkeypatch.chdir(hub[2])  # (no local tiny-org/ here)


def _empty(hub):
    cls, cfg, _ = hub
    with weightplan.init_empty():
        return cls(cfg)


@pytest.mark.parametrize("call", ["explain", "load", "adapter_name", "with_adapter"])
def test_a_repo_id_is_refused_saying_how_to_load_it(hub, offline, call):
    model = _empty(hub)
    calls = {"explain": lambda: weightplan.explain(model, REPO),
             "load": lambda: weightplan.load(model, REPO),
             "adapter_name": lambda: weightplan.explain(model, REPO, adapter_name="default"),
             "with_adapter": lambda: explain_with_adapter(model, REPO, hub[2] / "base")}
    loads = r"BASE, adapter='tiny-org/llama', " if call == "adapter_name" else r"'tiny-org/llama', "
    with pytest.raises(CheckpointError, match=(
            rf"^tiny-org/llama: no such file or directory; .* reads a local checkpoint .*"
            rf"weightplan\.from_pretrained\({loads}\.\.\.\) \(cache_dir=, revision=, token=, "
            r"local_files_only=\), or pass the directory "
            r"huggingface_hub\.snapshot_download\('tiny-org/llama'\) returns$")):
        calls[call]()


def test_the_ways_out_load_the_repo(hub, offline):
    import huggingface_hub

    expected = weightplan.from_pretrained(hub[2] / "base").state_dict()
    model = weightplan.from_pretrained(REPO)
    snapshot = _empty(hub)
    weightplan.load(snapshot, huggingface_hub.snapshot_download(REPO))
    for got in (model.state_dict(), snapshot.state_dict()):
        assert got.keys() == expected.keys()
        assert [k for k in got if not torch.equal(got[k], expected[k])] == []
