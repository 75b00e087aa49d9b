"""``weightplan.from_pretrained``: directory or repo id → the model transformers'
``from_pretrained`` gives. Repo ids come from a Hugging Face cache laid out here with
huggingface_hub's own naming (no network: the Hub is never asked)."""

import shutil

import huggingface_hub
import pytest
import torch
from huggingface_hub.file_download import repo_folder_name

import weightplan
from weightplan.cli import main
from weightplan.errors import CheckpointError, ModelBuildError

from tests.interop.matrix import FAMILIES, output, pretrained

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cached_repo(cache, repo_id: str, source) -> None:
    """Put ``source``'s files where huggingface_hub keeps a snapshot of ``repo_id``."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.copytree(source, repo / "snapshots" / COMMIT)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def saved(family: str, directory, **config):
    cls, cfg, inputs = FAMILIES[family]()
    for key, value in config.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    cls(cfg).save_pretrained(directory)
    return cls, inputs


@pytest.mark.parametrize("family", ["gemma2", "llava", "deepseek_v3", "t5"])
def test_a_directory_loads_like_transformers(family, tmp_path):
    cls, inputs = saved(family, tmp_path)
    model, report = weightplan.from_pretrained(tmp_path, return_report=True)
    reference = pretrained(cls, tmp_path)
    assert type(model) is cls and not model.training
    assert report.tensors_loaded > 0 and not report.missing and not report.unexpected
    for key, value in reference.state_dict().items():
        assert model.state_dict()[key].dtype == value.dtype, key
        assert torch.equal(model.state_dict()[key], value), key
    assert torch.equal(output(model, inputs), output(reference, inputs))


def test_auto_dtype_follows_the_config(tmp_path):
    cls, inputs = saved("llama", tmp_path / "ckpt")
    out = tmp_path / "bf16"
    weightplan.save(pretrained(cls, tmp_path / "ckpt").to(torch.bfloat16), out)
    model = weightplan.from_pretrained(out)  # the saved config says bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in weightplan.from_pretrained(out, dtype=torch.float32).parameters()
            } == {torch.float32}


def test_a_repo_id_loads_from_the_local_cache(tmp_path, offline):
    cls, inputs = saved("mixtral", tmp_path / "src")
    cached_repo(tmp_path / "cache", "tiny-org/tiny-mixtral", tmp_path / "src")
    model = weightplan.from_pretrained("tiny-org/tiny-mixtral", cache_dir=tmp_path / "cache")
    reference = pretrained(cls, tmp_path / "src")
    assert torch.equal(output(model, inputs), output(reference, inputs))


def test_the_cli_explains_a_repo_id(tmp_path, offline, monkeypatch, capsys):
    saved("qwen2", tmp_path / "src")
    cached_repo(tmp_path / "cache", "tiny-org/tiny-qwen2", tmp_path / "src")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    assert main(["explain", "tiny-org/tiny-qwen2"]) == 0
    out = capsys.readouterr().out
    assert "→ Qwen2ForCausalLM" in out and COMMIT in out


def test_a_repo_id_not_in_the_cache_offline_says_so(tmp_path, offline):
    with pytest.raises(CheckpointError, match="tiny-org/nothing.*HF_HUB_OFFLINE"):
        weightplan.from_pretrained("tiny-org/nothing", cache_dir=tmp_path)
    with pytest.raises(CheckpointError, match="not a Hugging Face repo id"):
        weightplan.from_pretrained(tmp_path / "no" / "such" / "dir")


def test_a_config_that_needs_remote_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "config.json").write_text(
        '{"model_type": "evil_model", "architectures": ["EvilModel"], '
        '"auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}}')
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelBuildError, match="config.json"):
        weightplan.from_pretrained(tmp_path)
    assert not marker.exists()



def _partly_cached(tmp_path, keep, **save) -> tuple:
    """A cache holding ``tiny-org/tiny-llama``'s snapshot with only the files ``keep``
    names (as ``AutoConfig.from_pretrained`` leaves it: config.json; or a download cut
    short), and the full checkpoint beside it (``save``: save_pretrained's options)."""
    cls, cfg, inputs = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path / "src", **save)
    (tmp_path / "partial").mkdir()
    for f in (tmp_path / "src").iterdir():
        if keep(f.name):
            shutil.copy(f, tmp_path / "partial" / f.name)
    cached_repo(tmp_path / "cache", "tiny-org/tiny-llama", tmp_path / "partial")
    return cls, inputs, tmp_path / "cache" / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT


def test_a_repo_cached_without_its_weights_is_fetched(tmp_path, monkeypatch):
    """Was: the snapshot AutoConfig.from_pretrained left (config.json only) was taken as the
    checkpoint: 'no .safetensors file in this directory', the Hub never asked."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cls, inputs, snapshot = _partly_cached(tmp_path, lambda name: name == "config.json")
    asked = []

    def download(**kwargs):  # the Hub: fetches what the cache lacks
        asked.append(kwargs)
        if not kwargs.get("local_files_only"):
            for f in (tmp_path / "src").iterdir():
                shutil.copy(f, snapshot / f.name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    model = weightplan.from_pretrained("tiny-org/tiny-llama", cache_dir=tmp_path / "cache")
    assert torch.equal(output(model, inputs), output(pretrained(cls, tmp_path / "src"), inputs))
    assert [a.get("local_files_only", False) for a in asked] == [True, False]
    assert asked[1]["allow_patterns"] == ["*.safetensors", "*.json"]


@pytest.mark.parametrize("keep, lacks", [
    (lambda name: name == "config.json", "no .safetensors file"),
    (lambda name: name != "model-00002-of-00003.safetensors", "model-00002-of-00003")])
def test_a_repo_cached_without_its_weights_offline_says_so(keep, lacks, tmp_path, offline):
    _partly_cached(tmp_path, keep, max_shard_size="40KB")
    assert (tmp_path / "src" / "model-00003-of-00003.safetensors").is_file()
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained("tiny-org/tiny-llama", cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert message.startswith("tiny-org/tiny-llama: the local cache holds the repo's "
                              f"snapshot {COMMIT} without its weights ("), message
    assert lacks in message and "HF_HUB_OFFLINE is set so the Hub was not asked" in message
    assert "hf download tiny-org/tiny-llama" in message


def test_a_subfolder_that_is_not_there(tmp_path, monkeypatch):
    """Was: '…/snapshots/<sha>/x: no local file or directory of that name …, and it is not
    a Hugging Face repo id (org/name)' for a repo id (and for a local directory) given
    with subfolder='x'."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, _, snapshot = _partly_cached(tmp_path, lambda name: True)
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained("tiny-org/tiny-llama", cache_dir=tmp_path / "cache",
                                   subfolder="x")
    assert "without its weights (no folder x/)" in str(caught.value)
    assert "not a Hugging Face repo id" not in str(caught.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")  # the Hub asked, and it has no folder x/ either
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kw: str(snapshot))
    with pytest.raises(CheckpointError, match=r"^tiny-org/tiny-llama: the repo has no folder x/"):
        weightplan.from_pretrained("tiny-org/tiny-llama", cache_dir=tmp_path / "cache",
                                   subfolder="x")
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained(tmp_path / "src", subfolder="x")
    assert str(caught.value) == (f"{tmp_path / 'src' / 'x'}: no local file or directory of "
                                 f"that name in {tmp_path / 'src'} (subfolder='x')")


def _shard_dtypes(directory) -> set:
    from safetensors import safe_open

    dtypes = set()
    for path in directory.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            dtypes |= {f.get_tensor(k).dtype for k in f.keys()}
    return dtypes


def _config_dtype(directory) -> str:
    import json

    return json.loads((directory / "config.json").read_text())["dtype"]


def test_a_cast_model_saved_back_says_the_dtype_its_shards_hold(tmp_path):
    """Was: loaded in bf16 from a float32 checkpoint, saved back (the checkpoint's float32
    shards, through the load record), its config.json said bfloat16 (the dtype loaded,
    set on the config at load): transformers' dtype="auto" then built it in bf16."""
    cls, _ = saved("llama", tmp_path / "ckpt")
    model = weightplan.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    weightplan.save(model, tmp_path / "out")
    assert _shard_dtypes(tmp_path / "out") == {torch.float32}
    assert _config_dtype(tmp_path / "out") == "float32"
    assert model.config.dtype == torch.bfloat16  # the model's own config is left alone
    back = cls.from_pretrained(tmp_path / "out", dtype="auto")
    assert {p.dtype for p in back.parameters()} == {torch.float32}


def test_a_save_without_a_cast_keeps_its_config_dtype(tmp_path):
    saved("llama", tmp_path / "ckpt")
    model = weightplan.from_pretrained(tmp_path / "ckpt")
    weightplan.save(model, tmp_path / "out")
    assert _shard_dtypes(tmp_path / "out") == {torch.float32}
    assert _config_dtype(tmp_path / "out") == "float32"


def test_a_cast_composite_model_saved_back_says_its_shards_dtype_in_every_sub_config(tmp_path):
    """Was: a Llava loaded in bf16 from float32 shards and saved back said float32 at the
    top of config.json but bfloat16 in text_config and vision_config (set there by the
    load), beside float32 shards."""
    import json

    saved("llava", tmp_path / "ckpt")
    model = weightplan.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    weightplan.save(model, tmp_path / "out")
    assert _shard_dtypes(tmp_path / "out") == {torch.float32}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "float32"
    said = {config[k]["dtype"] for k in ("text_config", "vision_config") if config[k].get("dtype")}
    assert said == {"float32"}, config
    assert model.config.text_config.dtype == torch.bfloat16  # the model's own: left alone


def test_a_mixed_checkpoint_cast_to_a_dtype_it_lacks_saves_a_config_of_its_own_dtypes(tmp_path):
    """Was: bf16 weights with float32 norms, loaded in float16 and saved back (those bf16
    and float32 shards), kept the float16 the load set on the config: transformers'
    dtype="auto" then built float16 and cast the bf16 weights into it."""
    import json

    from safetensors.torch import load_file, save_file

    cls, _ = saved("llama", tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    path = tmp_path / "ckpt" / "model.safetensors"
    state = {k: v.to(torch.float32 if "norm" in k else torch.bfloat16)
             for k, v in load_file(path).items()}
    save_file(state, path, metadata={"format": "pt"})
    for dtype, says in [(torch.float16, "bfloat16"), (torch.float32, "float32"),
                        ("auto", "bfloat16")]:
        model = weightplan.from_pretrained(tmp_path / "ckpt", dtype=dtype)
        weightplan.save(model, tmp_path / str(dtype))
        assert _shard_dtypes(tmp_path / str(dtype)) == {torch.bfloat16, torch.float32}
        assert _config_dtype(tmp_path / str(dtype)) == says, dtype
    back = cls.from_pretrained(tmp_path / str(torch.float16), dtype="auto")
    assert {p.dtype for p in back.parameters()} == {torch.bfloat16}
