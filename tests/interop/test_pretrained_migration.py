"""A user moving from transformers' ``from_pretrained``: the keywords passed by habit load
as they load there (transformers 5.25 is the oracle, on tiny models it saved)."""

import json
import shutil

import pytest
import torch
import transformers as T

import weightplan
from weightplan.errors import ModelBuildError

from tests.interop.matrix import FAMILIES, output, pretrained


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    cls, cfg, inputs = FAMILIES["llama"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(directory)
    return directory, cls, inputs


def _with_auto_map(source, target, auto_map):
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "auto_map": auto_map}))
    return target


def test_trust_remote_code_on_a_built_in_model_is_ignored_as_in_transformers(llama, tmp_path):
    """Was: ArgumentError 'remote code never runs' for a config with nothing remote in it
    (model_type built in, no auto_map), which transformers loads ignoring the keyword; an
    auto_map naming only a tokenizer's code is nothing a model load runs either."""
    directory, cls, inputs = llama
    tokenizer_only = _with_auto_map(directory, tmp_path / "tok", {
        "AutoTokenizer": ["tokenization_x.XTokenizer", None]})
    for path in (directory, tokenizer_only):
        theirs = pretrained(T.AutoModelForCausalLM, path, trust_remote_code=True)
        model = weightplan.from_pretrained(path, trust_remote_code=True)
        assert type(model) is type(theirs) is cls
        assert torch.equal(output(model, inputs), output(theirs, inputs))


def test_trust_remote_code_with_a_model_auto_map_is_refused_saying_why(llama, tmp_path):
    """transformers would import the checkpoint's modeling file: weightplan never does."""
    directory, _, _ = llama
    marker = tmp_path / "ran"
    remote = _with_auto_map(directory, tmp_path / "remote", {
        "AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    (remote / "modeling_x.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(ModelBuildError) as caught:
        weightplan.from_pretrained(remote, trust_remote_code=True)
    message = str(caught.value)
    assert "AutoModelForCausalLM" in message and "never runs code" in message
    assert "weightplan.load(model" in message  # what to do
    assert not marker.exists()


@pytest.mark.parametrize("keyword", ["low_cpu_mem_usage", "_fast_init", "offload_state_dict",
                                     "mirror", "from_tf", "from_flax"])
@pytest.mark.parametrize("value", [True, False])
def test_keywords_transformers_5_ignores_are_ignored(keyword, value, llama, recwarn):
    """transformers 5.25 pops these without reading them (no warning): was ArgumentError
    for ``low_cpu_mem_usage=False`` and the like."""
    directory, cls, inputs = llama
    theirs = pretrained(cls, directory, **{keyword: value})
    model = weightplan.from_pretrained(directory, **{keyword: value})
    assert torch.equal(output(model, inputs), output(theirs, inputs))
