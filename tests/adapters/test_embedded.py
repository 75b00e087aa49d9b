"""A directory holding a model and an adapter (config.json + model.safetensors beside
adapter_config.json + adapter_model.safetensors: peft's save_pretrained into the model's
directory). transformers 5.25 with peft installed (the oracle, checked) loads the base from
that directory and the adapter onto it (injected, unmerged, ``"default"``), whichever class
it is called on; weightplan does the same (was: the base only, the adapter silently dropped)."""

from __future__ import annotations

import builtins
import re

import pytest
import torch
import transformers as T

import weightplan
from weightplan.cli import main

from tests.interop.matrix import FAMILIES, output, pretrained

peft = pytest.importorskip("peft")
IDS = {"input_ids": torch.tensor([[1, 5, 9, 14, 2]])}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    directory = tmp_path_factory.mktemp("both")
    cls, cfg, _ = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(directory)
    torch.manual_seed(1)
    trained = peft.get_peft_model(cls(cfg), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    trained.save_pretrained(directory)
    assert (directory / "config.json").is_file() and (directory / "adapter_config.json").is_file()
    return directory


@pytest.mark.parametrize("cls", [T.AutoModelForCausalLM, T.LlamaForCausalLM])
def test_the_base_and_the_adapter_load_as_transformers_loads_them(both, cls):
    theirs = pretrained(cls, both)
    assert theirs._hf_peft_config_loaded  # (transformers injected the adapter)
    model = weightplan.from_pretrained(both, model_class=cls)
    assert type(model) is type(theirs) is T.LlamaForCausalLM
    mine, their = model.state_dict(), theirs.state_dict()
    assert mine.keys() == their.keys() and any("lora_A.default" in k for k in mine)
    assert [k for k in mine if not torch.equal(mine[k], their[k])] == []
    assert torch.equal(output(model, IDS), output(theirs, IDS))
    merged = weightplan.from_pretrained(both, model_class=cls, merge=True)  # (folded in)
    assert not any("lora" in k for k in merged.state_dict())
    assert torch.allclose(output(merged, IDS), output(theirs, IDS), atol=1e-5)


def test_the_cli_explains_base_and_adapter(both, capsys):
    """Was: AdapterError 'no base_model_name_or_path' (the base is the directory itself)."""
    assert main(["explain", str(both)]) == 0
    out = capsys.readouterr().out
    assert "+ adapter" in out and "problems: none" in out
    assert "adapter_model.safetensors is in" not in out  # (read: as the adapter)


def test_without_peft_the_base_loads_with_a_warning(both, monkeypatch, capsys):
    """transformers without peft loads the base alone, silently; weightplan too, saying so."""
    real = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "peft" else 1)
    with pytest.warns(UserWarning, match="adapter_config.json.*not loaded.*peft") as caught:
        model = weightplan.from_pretrained(both)
    assert caught[0].filename == __file__  # (the caller's line)
    assert not any("lora" in k for k in model.state_dict())
    with pytest.warns(UserWarning, match="not loaded"):  # the command line: the model alone
        assert main(["explain", str(both)]) == 0
    assert "+ adapter" not in capsys.readouterr().out


def test_a_hub_repo_with_both_and_a_variant_fetches_the_adapter(both, tmp_path, monkeypatch):
    """A repo id holding a model's fp16 variant and an adapter: transformers fetches the
    variant's files and then the adapter's (load_adapter); was: the Hub asked for the
    variant's files and the JSON only, so the load failed (AdapterError: no
    adapter_model.safetensors), and a snapshot cached so was taken as complete."""
    import fnmatch
    import shutil

    import huggingface_hub

    from tests.interop.test_from_pretrained import COMMIT, cached_repo

    plain, source = tmp_path / "plain", tmp_path / "source"
    plain.mkdir()
    shutil.copy(both / "config.json", plain)
    shutil.copy(both / "model.safetensors", plain)
    shutil.copytree(both, source, ignore=lambda d, names: ["model.safetensors"])
    T.AutoModelForCausalLM.from_pretrained(plain).save_pretrained(source, variant="fp16")
    theirs = pretrained(T.AutoModelForCausalLM, source, variant="fp16")  # (both, with peft)
    assert theirs._hf_peft_config_loaded
    kept = {"config.json", "adapter_config.json", "model.fp16.safetensors"}
    partial = tmp_path / "partial"  # (what a fetch of the variant's files and the JSON left)
    shutil.copytree(source, partial, ignore=lambda d, names: [n for n in names if n not in kept])
    cached_repo(tmp_path / "cache", "tiny-org/both", partial)
    snapshot = tmp_path / "cache" / "models--tiny-org--both" / "snapshots" / COMMIT
    asked = []

    def download(**kwargs):
        asked.append(kwargs)
        if not kwargs.get("local_files_only"):
            for f in source.iterdir():
                if any(fnmatch.fnmatch(f.name, p) for p in kwargs["allow_patterns"]):
                    shutil.copy(f, snapshot / f.name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    model = weightplan.from_pretrained("tiny-org/both", cache_dir=tmp_path / "cache",
                                       variant="fp16")
    assert "adapter_model.safetensors" in asked[-1]["allow_patterns"]
    assert any("lora_A.default" in k for k in model.state_dict())
    assert torch.equal(output(model, IDS), output(theirs, IDS))


def _plain(both, tmp_path):
    """The model alone (transformers with peft would load the adapter beside it too)."""
    import shutil

    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(both / name, plain)
    return pretrained(T.AutoModelForCausalLM, plain)


def test_explain_into_a_model_without_lora_layers_loads_the_model_and_says_so(both, tmp_path):
    """Was: AdapterError 'the model has no adapter 'default' injected' (the directory was
    taken for the adapter alone)."""
    with weightplan.init_empty():
        model = T.AutoModelForCausalLM.from_config(T.AutoConfig.from_pretrained(both))
    with pytest.warns(UserWarning, match="adapter beside the model is not loaded.*get_peft_model"):
        plan = weightplan.explain(model, both)
    assert not plan.problems and not plan.missing and not plan.unexpected
    assert any("not loaded" in n.message and "from_pretrained" in n.message for n in plan.notes)
    assert "adapter beside the model is not loaded" in str(plan)
    plan.execute()
    assert not any("lora" in k for k in model.state_dict())
    assert torch.equal(output(model.eval(), IDS), output(_plain(both, tmp_path), IDS))


@pytest.mark.parametrize("how", ["get_peft_model", "inject_adapter_in_model"])
def test_load_into_a_model_with_the_adapter_injected_loads_both(both, how):
    """Was: the adapter's tensors only, the base's left on meta (no problem said)."""
    theirs = pretrained(T.AutoModelForCausalLM, both)  # (transformers + peft: both)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    with weightplan.init_empty():
        model = T.AutoModelForCausalLM.from_config(T.AutoConfig.from_pretrained(both))
    model = peft.get_peft_model(model, config) if how == "get_peft_model" else \
        peft.inject_adapter_in_model(config, model)
    plan = weightplan.explain(model, both)
    assert not plan.problems and not plan.missing and plan.adapter is not None
    plan.execute()
    assert not any(p.is_meta for p in model.parameters())
    assert torch.equal(output(model.eval(), IDS), output(theirs, IDS))


@pytest.mark.parametrize("injected, name, found", [
    (None, "default", "none"), ("x", None, "['x']")])
def test_an_adapter_name_the_model_lacks_is_refused_naming_those_it_has(both, injected, name,
                                                                         found):
    """Was: 'none of the adapter's 8 tensors has a place in the model's adapter 'default'
    (... the model holds ['lm_head.weight'])': the directory's base and adapter planned
    into a model without that adapter (the adapter-only path said so)."""
    from weightplan.errors import AdapterError

    with weightplan.init_empty():
        model = T.AutoModelForCausalLM.from_config(T.AutoConfig.from_pretrained(both))
    if injected is not None:
        model = peft.inject_adapter_in_model(peft.LoraConfig(
            r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]), model, adapter_name=injected)
    with pytest.raises(AdapterError, match=rf"has no adapter 'default' injected \(adapters "
                                           rf"found: {re.escape(found)}\)"):
        weightplan.explain(model, both, adapter_name=name)
