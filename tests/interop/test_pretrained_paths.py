"""A mistyped relative path is first said to be no local directory (with the names nearby),
then what the Hub attempt found, then the offline way out; the CLI says the same."""

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.errors import CheckpointError


@pytest.fixture
def ckpts(tmp_path, monkeypatch):
    (tmp_path / "ckpts" / "llama").mkdir(parents=True)
    (tmp_path / "ckpts" / "llama" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_typo_offline_says_no_local_directory_first(ckpts, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained("ckpts/lama")
    message = str(caught.value)
    assert message.startswith("ckpts/lama: no local file or directory of that name "
                              "(did you mean ckpts/llama?); as a Hugging Face repo id it is "
                              "not in the local cache, and HF_HUB_OFFLINE is set")
    assert "hf download ckpts/lama" in message and "local_files_only=True" in message
    assert "internet connection" not in message


def test_local_files_only_never_asks_the_hub(ckpts, monkeypatch):
    import huggingface_hub

    asked = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda **kw: asked.append(kw["local_files_only"]) or real(**kw))
    with pytest.raises(CheckpointError, match="local_files_only=True so the Hub was not asked"):
        weightplan.from_pretrained("ckpts/lama", local_files_only=True)
    assert asked == [True]


def test_a_typo_online_says_what_the_hub_found(ckpts, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained("ckpts/lama")
    message = str(caught.value)
    first, _, rest = message.partition("; as a Hugging Face repo id: ")
    assert first.startswith("ckpts/lama: no local file or directory") and rest
    # no network here: unreachable; with one: no such repo. Either is said in our words.
    assert "the Hub can't be reached" in rest or "the Hub has no repo" in rest
    assert "to use it offline" in rest


def test_a_path_that_is_no_repo_id(ckpts):
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained("./ckpts/lama")
    assert str(caught.value) == ("ckpts/lama: no local file or directory of that name (did you "
                                 "mean ckpts/llama?), and it is not a Hugging Face repo id "
                                 "(org/name)")
    with pytest.raises(CheckpointError, match=r"nor models/ under"):
        weightplan.from_pretrained("models/lama")


def test_the_cli_says_the_same(ckpts, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["explain", "ckpts/lama"]) == 3
    err = capsys.readouterr().err
    assert "CheckpointError: ckpts/lama: no local file or directory of that name (did you mean" \
           " ckpts/llama?)" in err


def test_a_real_directory_still_loads(tmp_path, monkeypatch):
    from tests.interop.matrix import FAMILIES, output

    cls, cfg, inputs = FAMILIES["qwen2"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)  # "org/name" is a path here, and a repo id in form
    model = weightplan.from_pretrained("org/name")
    assert torch.equal(output(model, inputs), output(cls.from_pretrained("org/name"), inputs))
