"""``weightplan explain CKPT_DIR``: config.json → model on meta → the full plan."""

import json

import pytest

from weightplan.cli import main

from tests.conftest import moe_checkpoint, write_checkpoint

import transformers as T  # noqa: E402  (a dev dependency: always installed by `make test`)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    from tests.interop.oracle import save
    from tests.interop.families import llava

    cls, cfg, _ = llava()
    return save(cls, cfg, tmp_path_factory.mktemp("llava"))


def test_explain_builds_the_model_named_in_config_json(llava_dir, capsys):
    assert main(["explain", str(llava_dir)]) == 0
    out = capsys.readouterr().out
    assert "→ LlavaForConditionalGeneration (64 tensors" in out
    assert "model (LlavaModel): class LlavaModel, 1 transform, scoped to model.*" in out
    assert "peak estimate:" in out and "problems: none" in out


def test_explain_json_has_the_full_plan(llava_dir, capsys):
    assert main(["explain", str(llava_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["class"] == "LlavaForConditionalGeneration"
    assert [s["path"] for s in data["mapping"]["submodules"]] == ["", "model", "model.vision_tower"]
    assert data["missing"] == [] and data["unexpected"] == [] and data["mismatched"] == {}
    assert data["peak_bytes"] >= data["model_bytes"] > 0


def test_a_config_transformers_cannot_read_says_what_failed(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    (directory / "config.json").write_text(json.dumps({"model_type": "no_such_model_type"}))
    assert main(["explain", str(directory)]) == 5
    err = capsys.readouterr().err
    assert "ModelBuildError" in err and "config.json: transformers can't read this config" in err
    assert "no_such_model_type" in err


def test_a_model_transformers_cannot_build_says_what_failed(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    config = T.MixtralConfig(hidden_size=32, num_attention_heads=4, hidden_act="no_such_act",
                             num_hidden_layers=1, architectures=["MixtralForCausalLM"])
    config.save_pretrained(directory)
    assert main(["explain", str(directory)]) == 5
    err = capsys.readouterr().err
    assert "ModelBuildError" in err and "MixtralForCausalLM" in err


def test_without_config_json_the_keys_are_explained_without_a_model(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "c", moe_checkpoint())
    assert main(["explain", str(directory)]) == 0
    captured = capsys.readouterr()
    assert "no config.json" in captured.err and "→ no model" in captured.out


def test_model_type_still_explains_without_a_model(llava_dir, capsys):
    assert main(["explain", str(llava_dir), "--model-type", "llava"]) == 0
    out = capsys.readouterr().out
    assert "→ no model" in out and "language_model.lm_head.weight → lm_head.weight" in out
