"""A config.json whose ``auto_map`` names classes in the checkpoint's own .py files
(Phi-3's, MiniCPM's): transformers 5.25 (the oracle) builds its own classes for a
``model_type`` it has, unless ``trust_remote_code=True``; weightplan builds the same and
refuses, never importing a file, where transformers would import the code."""

import json
import shutil

import pytest
import torch
import transformers as T

import weightplan
from weightplan.errors import ModelBuildError

from tests.interop.matrix import output, pretrained

IDS = torch.tensor([[1, 5, 9, 14, 2]])
FULL = {"AutoConfig": "configuration_phi3.Phi3Config",
        "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
        "AutoModel": "modeling_phi3.Phi3Model"}


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """A tiny Phi-3 saved by transformers, as its Hub repos ship it: an auto_map naming
    configuration_phi3.py / modeling_phi3.py beside it (which write a marker if imported)."""
    root = tmp_path_factory.mktemp("phi3")
    cfg = T.Phi3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                       max_position_embeddings=64)
    torch.manual_seed(0)
    T.Phi3ForCausalLM(cfg).save_pretrained(root / "plain")
    return root


def _with(root, name, auto_map, **fields):
    directory = root / name
    if not directory.exists():
        shutil.copytree(root / "plain", directory)
        config = json.loads((directory / "config.json").read_text())
        config.update(fields, auto_map=auto_map)
        (directory / "config.json").write_text(json.dumps(config))
        marker = root / f"{name}.ran"
        for module in ("configuration_phi3", "modeling_phi3"):
            (directory / f"{module}.py").write_text(
                f"open({str(marker)!r}, 'a').write({module!r})\nraise SystemExit('ran')\n")
    return directory, root / f"{name}.ran"


@pytest.mark.parametrize("trust", [None, False])
@pytest.mark.parametrize("auto", ["AutoModelForCausalLM", "AutoModel"])
def test_a_built_in_model_type_loads_its_built_in_class(phi3, trust, auto):
    """Was: ModelBuildError 'auto_map ... asks to run Python code' for every such config.
    transformers (checked): Phi3ForCausalLM / Phi3Model with Phi3Config, nothing imported."""
    directory, marker = _with(phi3, "full", FULL)
    keywords = {} if trust is None else {"trust_remote_code": trust}
    cls = getattr(T, auto)
    theirs = pretrained(cls, directory, **keywords)
    model = weightplan.from_pretrained(directory, model_class=cls, **keywords)
    assert type(model) is type(theirs) is {"AutoModel": T.Phi3Model}.get(auto, T.Phi3ForCausalLM)
    assert type(model.config) is type(theirs.config) is T.Phi3Config
    mine, their = dict(model.named_parameters()), dict(theirs.named_parameters())
    assert mine.keys() == their.keys()
    assert all(torch.equal(mine[k], v) for k, v in their.items())
    if auto == "AutoModelForCausalLM":
        assert torch.equal(output(model, {"input_ids": IDS}), output(theirs, {"input_ids": IDS}))
        default = weightplan.from_pretrained(directory, **keywords)  # architectures' class
        assert type(default) is T.Phi3ForCausalLM
    assert not marker.exists()


def test_the_cli_explains_it_with_the_built_in_class(phi3, capsys):
    from weightplan.cli import main

    directory, marker = _with(phi3, "full", FULL)
    assert main(["explain", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "Phi3ForCausalLM" in out and "problems: none" in out
    assert not marker.exists()


@pytest.mark.parametrize("auto_map, auto, refused", [
    (FULL, None, "'AutoConfig', 'AutoModel', 'AutoModelForCausalLM'"),
    (FULL, T.AutoModel, "'AutoConfig', 'AutoModel'"),
    ({"AutoConfig": FULL["AutoConfig"]}, T.AutoModelForCausalLM, "'AutoConfig'"),
    ({"AutoModelForCausalLM": FULL["AutoModelForCausalLM"]}, T.AutoModelForCausalLM,
     "'AutoModelForCausalLM'"),
])
def test_trust_remote_code_true_is_refused_where_transformers_imports(phi3, auto_map, auto,
                                                                        refused):
    """transformers (checked) imports AutoConfig's entry and the auto class's own under
    trust_remote_code=True: weightplan refuses those loads, naming the entries."""
    directory, marker = _with(phi3, "t_" + "_".join(sorted(auto_map)), auto_map)
    with pytest.raises(ModelBuildError) as caught:
        weightplan.from_pretrained(directory, trust_remote_code=True, model_class=auto)
    message = str(caught.value)
    assert f"auto_map ([{refused}])" in message and "trust_remote_code=True" in message
    assert "weightplan.load(model, path)" in message and "never runs code" in message
    assert not marker.exists()


def test_trust_remote_code_true_loads_what_transformers_builds_itself(phi3):
    """An auto class auto_map doesn't name, or a model class: transformers builds its own
    class even under trust_remote_code=True (checked), and so does weightplan."""
    directory, marker = _with(phi3, "model_only", {
        "AutoModelForCausalLM": FULL["AutoModelForCausalLM"]})
    theirs = pretrained(T.AutoModel, directory, trust_remote_code=True)
    model = weightplan.from_pretrained(directory, trust_remote_code=True, model_class=T.AutoModel)
    assert type(model) is type(theirs) is T.Phi3Model
    full, _ = _with(phi3, "full", FULL)
    for path in (directory, full):
        theirs = pretrained(T.Phi3ForCausalLM, path, trust_remote_code=True)
        model = weightplan.from_pretrained(path, trust_remote_code=True,
                                           model_class=T.Phi3ForCausalLM)
        assert type(model) is type(theirs) is T.Phi3ForCausalLM
        assert torch.equal(output(model, {"input_ids": IDS}), output(theirs, {"input_ids": IDS}))
    assert not marker.exists()


@pytest.mark.parametrize("trust", [None, True])
def test_a_model_type_transformers_lacks_is_refused(phi3, trust):
    """transformers: ValueError 'contains custom code which must be executed' (without
    trust_remote_code), the shipped classes imported (with): weightplan refuses both."""
    directory, marker = _with(phi3, "custom", FULL, model_type="phi3_custom")
    with pytest.raises(ValueError, match="custom code"):
        T.AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=False)
    with pytest.raises(ModelBuildError) as caught:
        weightplan.from_pretrained(directory, trust_remote_code=trust)
    message = str(caught.value)
    assert "no class of its own for model_type 'phi3_custom'" in message
    assert "weightplan.load(model, path)" in message
    assert not marker.exists()
