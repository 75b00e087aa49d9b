"""Mappings by name: built-in, bridged from transformers, or a suggestion for a typo."""

import pytest
import torch

import weightplan
from weightplan.cli import main
from weightplan.errors import RegistryError

from tests.interop.matrix import FAMILIES


def test_a_bridged_family_is_usable_by_model_type(tmp_path):
    cls, cfg, _ = FAMILIES["phimoe"]()
    cls(cfg).save_pretrained(tmp_path)
    plan = weightplan.explain(None, tmp_path, mapping="phimoe")
    assert "via the transformers bridge" in plan.mapping.reason
    assert any(r.converter is not None for r in plan.routing.routes)  # experts merged


def test_a_family_without_conversion_is_usable_too(tmp_path, capsys):
    cls, cfg, _ = FAMILIES["llama"]()
    cls(cfg).save_pretrained(tmp_path)
    assert main(["explain", str(tmp_path), "--model-type", "llama"]) == 0
    assert "without conversion" in capsys.readouterr().out
    out = tmp_path / "converted"
    assert main(["convert", str(tmp_path), str(out), "--model-type", "llama"]) == 0
    assert (out / "model.safetensors").is_file()


def test_mappings_lists_bridged_families(capsys):
    assert main(["mappings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "mixtral" in lines and "phimoe (transformers bridge)" in lines


def test_a_typo_gets_the_closest_names(tmp_path, capsys):
    with pytest.raises(RegistryError, match="did you mean .*mixtral"):
        weightplan.explain(None, {"a": torch.zeros(1)}, mapping="mixtrall")
    with pytest.raises(RegistryError, match="did you mean .*mixtral"):
        weightplan.get_mapping("mixtrl")
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
    assert main(["explain", str(tmp_path / "x.safetensors"), "--model-type", "phimo"]) == 5
    assert "did you mean phimoe" in capsys.readouterr().err


def test_a_model_type_transformers_converts_by_class_names_the_classes(tmp_path, capsys):
    """Was: ``--model-type gpt_neox`` (or ``qwen2_vl``) said "transformers loads it without
    conversion" and copied the keys as they were, while transformers renames them, by class:
    GPTNeoXForCausalLM's ``embed_out`` → ``lm_head``. The class names are what to pass."""
    import transformers as T

    cfg = T.GPTNeoXConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                          num_hidden_layers=2, num_attention_heads=4)
    torch.manual_seed(0)
    T.GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path / "src")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out"),
                 "--model-type", "gpt_neox"]) == 5
    err = capsys.readouterr().err
    assert "by class" in err and "GPTNeoXForCausalLM" in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(RegistryError, match="GPTNeoXForCausalLM"):
        weightplan.explain(None, tmp_path / "src", mapping="gpt_neox")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "src" / "model.safetensors"), "pt") as f:
        assert "embed_out.weight" in set(f.keys())
    # by name, or (no --model-type) the class config.json's architectures names, looked up
    # first as transformers looks it up
    for out, flags in (("named", ["--model-type", "GPTNeoXForCausalLM"]), ("config", [])):
        assert main(["convert", str(tmp_path / "src"), str(tmp_path / out), *flags]) == 0
        assert "class 'GPTNeoXForCausalLM'" in capsys.readouterr().out or not flags
        with safe_open(str(tmp_path / out / "model.safetensors"), "pt") as f:
            assert "lm_head.weight" in set(f.keys()) and "embed_out.weight" not in set(f.keys())
        back = T.GPTNeoXForCausalLM.from_pretrained(tmp_path / out)
        assert torch.equal(back.lm_head.weight,
                           T.GPTNeoXForCausalLM.from_pretrained(tmp_path / "src").lm_head.weight)
