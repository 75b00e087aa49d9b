"""``variant=`` wherever a checkpoint directory is read: ``explain`` / ``load`` into a model
you built (as ``from_pretrained(variant=...)`` reads the directory; transformers 5.25 is the
oracle), and ``weightplan explain ADAPTER_DIR --base BASE --variant V`` (the base's files)."""

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.errors import ArgumentError, CheckpointError

from tests.interop.matrix import FAMILIES, output, pretrained


@pytest.mark.parametrize("variant", ["fp16", "bf16"])
def test_explain_and_load_take_variant(variant, variants):
    """Was: ArgumentError 'explain() got an unexpected keyword argument 'variant''."""
    directory, cls, inputs = variants
    theirs = pretrained(cls, directory, variant=variant, dtype=torch.float32)  # (the model's)
    _, cfg, _ = FAMILIES["llama"]()
    with weightplan.init_empty():
        model = cls(cfg)
    plan = weightplan.explain(model, directory, variant=variant)
    assert not plan.problems and not plan.missing and not plan.unexpected
    other = {"fp16": "bf16", "bf16": "fp16"}[variant]
    assert any(f"the weight variant {other!r}, and the load is given variant={variant!r}"
               in note.message for note in plan.notes)
    plan.execute()
    with weightplan.init_empty():
        loaded = cls(cfg)
    weightplan.load(loaded, directory, variant=variant)
    for mine in (model, loaded):
        their = dict(theirs.named_parameters())
        for name, tensor in mine.named_parameters():
            assert tensor.dtype == their[name].dtype and torch.equal(tensor, their[name]), name
        assert torch.equal(output(mine.eval(), inputs), output(theirs, inputs))
    assert weightplan.explain(None, directory, variant=variant).checkpoint.files


def test_variant_where_it_picks_nothing_says_why(variants, tmp_path):
    directory, _, _ = variants
    with pytest.raises(CheckpointError, match=r"no model\.int8\.safetensors.*variant='int8'"):
        weightplan.explain(None, directory, variant="int8")
    with pytest.raises(ArgumentError, match=r"variant='\.\./x': pass the word"):
        weightplan.load(torch.nn.Linear(2, 2), directory, variant="../x")
    with pytest.raises(ArgumentError, match="is a file; give its directory"):
        weightplan.explain(None, directory / "model.bf16.safetensors", variant="bf16")
    with pytest.raises(ArgumentError, match="the checkpoint is a dict: give the directory"):
        weightplan.explain(None, {"w": torch.zeros(1)}, variant="bf16")
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(ArgumentError, match="adapter directory.*from_pretrained\\(BASE, "
                                            "variant='bf16', adapter=ADAPTER_DIR\\)"):
        weightplan.explain(torch.nn.Linear(2, 2), adapter, variant="bf16")


def test_cli_adapter_with_a_variant_base(variants, tmp_path, capsys):
    """Was: ArgumentError '--variant picks a model's weight files: ... is an adapter
    directory; drop --variant', with --base given: the variant picks the base's files, as
    from_pretrained(BASE, variant=..., adapter=...) reads them (peft's adapter files have
    no variant)."""
    peft = pytest.importorskip("peft")
    directory, cls, inputs = variants
    _, cfg, _ = FAMILIES["llama"]()
    torch.manual_seed(3)
    trained = peft.get_peft_model(cls(cfg), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"], init_lora_weights=False))
    trained.save_pretrained(tmp_path / "lora")
    lora = str(tmp_path / "lora")
    assert main(["explain", lora, "--base", str(directory), "--variant", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "(3 files, 29 tensors" in out, out  # two fp16 shards + the adapter
    assert "problems: none" in out and "--variant fp16" in out  # (the bf16 file's note)
    assert main(["explain", lora, "--base", str(directory)]) == 3  # the base's two variants
    assert "pass --variant bf16" in capsys.readouterr().err
    oracle = peft.PeftModel.from_pretrained(pretrained(cls, directory, variant="fp16"), lora)
    model = weightplan.from_pretrained(directory, variant="fp16", adapter=lora)
    assert torch.equal(output(model, inputs), output(oracle, inputs))


def test_convert_takes_variant(variants, tmp_path, capsys):
    """A directory holding only variants (refused without one, as transformers refuses it):
    the refusal said 'pass --variant bf16', and convert had no --variant ('unrecognized
    arguments'), so the command line could not convert it at all (it read a variant alone
    before). weightplan convert DIR OUT --variant V / explain_convert(variant=V): that
    variant's files, converted; OUT loads as transformers loads the variant."""
    import weightplan

    directory, cls, inputs = variants
    assert main(["convert", str(directory), str(tmp_path / "none"), "--dry-run"]) == 3
    assert "pass --variant bf16" in capsys.readouterr().err
    assert main(["convert", str(directory), str(tmp_path / "out"), "--variant", "fp16"]) == 0
    theirs = pretrained(cls, directory, variant="fp16")
    converted = pretrained(cls, tmp_path / "out")
    assert torch.equal(output(converted, inputs), output(theirs, inputs))
    plan = weightplan.explain_convert(directory, tmp_path / "api", variant="bf16")
    assert [f.path.rsplit("/", 1)[-1] for f in plan.checkpoint.files] == ["model.bf16.safetensors"]


def test_a_cached_adapter_repo_loads_onto_its_base_variant_offline(variants, tmp_path,
                                                                   monkeypatch, capsys):
    """An adapter repo (adapter files only) whose base is a repo of variants, both cached,
    offline: transformers with peft loads the base's fp16 files and the adapter; was:
    CheckpointError 'the local cache holds the repo's snapshot ... without its weights
    (no model.fp16.safetensors ...)', the adapter's snapshot judged by the base's variant."""
    import json

    import huggingface_hub

    from tests.interop.test_from_pretrained import cached_repo

    peft = pytest.importorskip("peft")
    directory, cls, inputs = variants
    _, cfg, _ = FAMILIES["llama"]()
    torch.manual_seed(3)
    trained = peft.get_peft_model(cls(cfg), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))
    trained.save_pretrained(tmp_path / "lora")
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps(
        {**config, "base_model_name_or_path": "tiny-org/variants"}))
    cache = tmp_path / "cache"
    cached_repo(cache, "tiny-org/variants", directory)
    cached_repo(cache, "tiny-org/lora", tmp_path / "lora")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = weightplan.from_pretrained("tiny-org/lora", variant="fp16")
    oracle = peft.PeftModel.from_pretrained(pretrained(cls, directory, variant="fp16"),
                                            tmp_path / "lora")
    assert torch.equal(output(model, inputs), output(oracle, inputs))
    assert main(["explain", "tiny-org/lora", "--variant", "fp16"]) == 0
    assert "problems: none" in capsys.readouterr().out


def test_an_adapter_repo_finds_its_base_in_the_cache_dir_given(variants, tmp_path, monkeypatch):
    """from_pretrained(ADAPTER_REPO, cache_dir=C): the base its config names is looked up in
    C too, as transformers looks it up; was: in the default cache only (AdapterError: its
    base 'tiny-org/variants' is not here)."""
    import json

    from tests.interop.test_from_pretrained import cached_repo

    peft = pytest.importorskip("peft")
    directory, cls, inputs = variants
    _, cfg, _ = FAMILIES["llama"]()
    trained = peft.get_peft_model(cls(cfg), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    trained.save_pretrained(tmp_path / "lora")
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps(
        {**config, "base_model_name_or_path": "tiny-org/variants"}))
    cache = tmp_path / "cache"
    cached_repo(cache, "tiny-org/variants", directory)
    cached_repo(cache, "tiny-org/lora", tmp_path / "lora")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = weightplan.from_pretrained("tiny-org/lora", cache_dir=cache, variant="bf16")
    assert any("lora_A.default" in k for k in model.state_dict())
