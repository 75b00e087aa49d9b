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
    assert main(["explain", str(tmp_path / "x.safetensors"), "--model-type", "phimo"]) == 2
    assert "did you mean phimoe" in capsys.readouterr().err
