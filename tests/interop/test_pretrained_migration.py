"""A user moving from transformers' ``from_pretrained``: the keywords passed by habit load
as they load there (transformers 5.25 is the oracle, on tiny models it saved)."""

import json
import shutil

import pytest
import torch
import transformers as T

import weightplan
from weightplan.errors import ArgumentError, CheckpointError, ModelBuildError

from tests.interop.matrix import output, pretrained


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


@pytest.mark.parametrize("variant", ["fp16", "bf16"])
def test_variant_picks_the_files_transformers_picks(variant, variants):
    """Was: ArgumentError 'variant files are not picked by name'."""
    directory, cls, inputs = variants
    theirs = pretrained(cls, directory, variant=variant)
    model = weightplan.from_pretrained(directory, variant=variant)
    mine, their = dict(model.named_parameters()), dict(theirs.named_parameters())
    assert mine.keys() == their.keys()
    for name, tensor in their.items():
        assert mine[name].dtype == tensor.dtype and torch.equal(mine[name], tensor), name
    assert torch.equal(output(model, inputs), output(theirs, inputs))


def test_variants_only_without_variant_name_them(variants, tmp_path):
    """Was: HeaderError 'key also present in …/model.bf16.safetensors' (every file read
    together); transformers: OSError 'no file named model.safetensors'."""
    directory, cls, _ = variants
    with pytest.raises(OSError):
        cls.from_pretrained(directory)
    with pytest.raises(CheckpointError) as caught:
        weightplan.from_pretrained(directory)
    message = str(caught.value)
    assert "'bf16', 'fp16'" in message and "variant='bf16'" in message
    assert "also present" not in message
    with pytest.raises(CheckpointError, match=r"no model\.int8\.safetensors nor "
                       r"model\.safetensors\.index\.int8\.json.*variants here: 'bf16', 'fp16'"):
        weightplan.from_pretrained(directory, variant="int8")
    with pytest.raises(ArgumentError, match="variant='../x'"):
        weightplan.from_pretrained(directory, variant="../x")
    # a plain model.safetensors beside variants is read alone, as transformers reads it,
    # the variants noted
    one = tmp_path / "one"
    one.mkdir()
    for name in ("config.json", "model.bf16.safetensors"):
        shutil.copy(directory / name, one / name)
    shutil.copy(directory / "model.bf16.safetensors", one / "model.safetensors")
    report = weightplan.from_pretrained(one, return_report=True)[1]
    assert not report.missing


@pytest.mark.parametrize("variant, files", [
    ("bf16", ["model.bf16.safetensors"]),
    ("fp16", ["model.safetensors.index.fp16.json", "model.fp16-00001-of-00002.safetensors",
              "model.fp16-00002-of-00002.safetensors"])])
def test_one_variant_alone_without_variant_is_refused_as_transformers_does(variant, files,
                                                                           variants, tmp_path):
    """Was: the variant's files read as the checkpoint, as if variant= had been given;
    transformers (checked, one file and sharded): OSError 'Error no file named
    model.safetensors, or pytorch_model.bin, found in directory'. weightplan refuses it
    too, naming the variant and how to pick it."""
    directory, cls, inputs = variants
    one = tmp_path / variant
    one.mkdir()
    for name in ("config.json", *files):
        shutil.copy(directory / name, one / name)
    with pytest.raises(OSError, match="no file named model.safetensors"):
        cls.from_pretrained(one)
    for call in (lambda: weightplan.from_pretrained(one), lambda: weightplan.explain(None, one)):
        with pytest.raises(CheckpointError) as caught:
            call()
        message = str(caught.value)
        assert f"only the weight variant {variant!r}" in message, message
        assert f"pass variant={variant!r}" in message and "no file named model.safetensors" in message
    model = weightplan.from_pretrained(one, variant=variant)  # what the error says to do
    assert torch.equal(output(model, inputs), output(pretrained(cls, one, variant=variant), inputs))


def test_variant_from_the_hub_cache_fetches_only_its_files(variants, tmp_path, monkeypatch):
    """A repo id: the cached snapshot's variant is read; the Hub is asked for the
    variant's files only, and an adapter's file (as transformers fetches them)."""
    import huggingface_hub

    from tests.interop.test_from_pretrained import COMMIT, cached_repo

    directory, cls, inputs = variants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached_repo(tmp_path / "cache", "tiny-org/variants", directory)
    model = weightplan.from_pretrained("tiny-org/variants", cache_dir=tmp_path / "cache",
                                       variant="fp16")
    assert torch.equal(output(model, inputs), output(pretrained(cls, directory, variant="fp16"),
                                                     inputs))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    snapshot = tmp_path / "cache" / "models--tiny-org--variants" / "snapshots" / COMMIT
    for shard in snapshot.glob("model.fp16-*"):
        shard.unlink()  # a download cut short: the Hub is asked for the rest
    asked = []

    def download(**kwargs):
        asked.append(kwargs)
        if not kwargs.get("local_files_only"):
            for f in directory.glob("model.fp16-*"):
                shutil.copy(f, snapshot / f.name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    weightplan.from_pretrained("tiny-org/variants", cache_dir=tmp_path / "cache", variant="fp16")
    assert asked[-1]["allow_patterns"] == ["model.fp16.safetensors", "model.fp16-*.safetensors",
                                           "model-*.fp16.safetensors",
                                           "adapter_model.safetensors", "*.json"]


def test_cli_explain_variant(variants, capsys):
    from weightplan.cli import main

    directory, _, _ = variants
    assert main(["explain", str(directory)]) == 3
    assert "--variant bf16" in capsys.readouterr().err
    assert main(["explain", str(directory), "--variant", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "(2 files, 21 tensors" in out and "problems: none" in out
    assert ("model.bf16.safetensors is in" in out
            and "a file of the weight variant 'bf16', and the load is given --variant fp16" in out)


def test_cli_variant_is_checked_before_the_hub_is_asked(monkeypatch, capsys):
    """``explain org/name --variant ../x``: refused as from_pretrained refuses it (was: the
    Hub asked for files named by it, then the error)."""
    import huggingface_hub

    from weightplan.cli import main

    asked = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **k: asked.append(k))
    assert main(["explain", "tiny-org/no-such-repo", "--variant", "../x"]) == 2
    err = capsys.readouterr().err  # (in the command line's words: the flag)
    assert "ArgumentError: --variant ../x: pass the word" in err and "--variant fp16)" in err
    assert "variant='" not in err and not asked


@pytest.mark.parametrize("model_class", [T.AutoModelForSequenceClassification,
                                         T.LlamaForSequenceClassification])
def test_model_class_picks_the_head_as_the_auto_class_does(model_class, llama):
    """transformers users pick the head by the class they call from_pretrained on (a base
    causal LM into a classifier): its head is missing and initialized, the LM head is
    unexpected, as transformers' LOAD REPORT says; the base weights equal its."""
    directory, _, _ = llama
    theirs, info = model_class.from_pretrained(directory, output_loading_info=True)
    model, mine = weightplan.from_pretrained(directory, model_class=model_class,
                                             output_loading_info=True)
    assert type(model) is type(theirs) is T.LlamaForSequenceClassification
    assert mine["missing_keys"] == set(info["missing_keys"]) == {"score.weight"}
    assert mine["unexpected_keys"] == set(info["unexpected_keys"]) == {"lm_head.weight"}
    their = dict(theirs.named_parameters())
    for name, tensor in model.named_parameters():
        if name != "score.weight":
            assert torch.equal(tensor, their[name]), name
    assert not model.score.weight.is_meta and model.score.weight.abs().sum() > 0


def test_a_model_class_that_does_not_fit_says_why(llama):
    directory, _, _ = llama
    for wrong, says in ((T.BertForSequenceClassification, "BertConfig"),
                        (T.AutoModelForImageClassification, "no AutoModelForImageClassification"),
                        ("LlamaForSequenceClassification", "a class")):
        with pytest.raises(ArgumentError, match=says):
            weightplan.from_pretrained(directory, model_class=wrong)


@pytest.mark.parametrize("base, head", [(T.BertModel, T.BertForMaskedLM),
                                        (T.RobertaModel, T.RobertaForMaskedLM)])
def test_missing_keys_name_every_name_of_a_tied_tensor_loaded_by_none(base, head, tmp_path):
    """Was: a base encoder's checkpoint into its masked-LM head left ``cls.predictions.bias``
    (RoBERTa: ``lm_head.bias``) and the decoder bias tied to it missing, and
    ``missing_keys`` named one of the two; transformers names both (a tie none of whose
    names loaded stays missing under each name)."""
    config = base.config_class(vocab_size=96, hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, num_attention_heads=4,
                               max_position_embeddings=20, pad_token_id=1)
    torch.manual_seed(0)
    base(config).save_pretrained(tmp_path)
    _, info = head.from_pretrained(tmp_path, output_loading_info=True)
    _, mine = weightplan.from_pretrained(tmp_path, model_class=head, output_loading_info=True)
    assert any(k.endswith("decoder.bias") for k in info["missing_keys"])
    assert mine["missing_keys"] == set(info["missing_keys"])
    assert mine["unexpected_keys"] == set(info["unexpected_keys"])


def test_config_overrides_apply_as_in_transformers(llama, tmp_path):
    """``AutoModelForSequenceClassification.from_pretrained(base, num_labels=3)``, the
    fine-tuning call: was an ArgumentError 'config overrides are not applied'. The config
    gets the keyword as transformers' gives it (a 3-row head, missing and initialized, as
    its loading info says; the base weights equal), ``output_attentions=True`` too."""
    directory, cls, inputs = llama
    theirs, info = T.AutoModelForSequenceClassification.from_pretrained(
        directory, num_labels=3, output_loading_info=True)
    model, mine = weightplan.from_pretrained(
        directory, model_class=T.AutoModelForSequenceClassification, num_labels=3,
        output_loading_info=True)
    assert model.score.weight.shape == theirs.score.weight.shape == (3, 32)
    assert model.config.id2label == theirs.config.id2label and model.config.num_labels == 3
    assert mine == {k: set(v) if isinstance(v, list) and k != "error_msgs" else v
                    for k, v in info.items()}
    their = dict(theirs.named_parameters())
    for name, tensor in model.named_parameters():
        if name != "score.weight":
            assert torch.equal(tensor, their[name]), name
    assert not model.score.weight.is_meta
    theirs = pretrained(cls, directory, output_attentions=True, use_cache=False)
    model = weightplan.from_pretrained(directory, output_attentions=True, use_cache=False)
    for config in (model.config, theirs.config):
        assert (config.output_attentions, config.use_cache) == (True, False)
    assert model.config._attn_implementation == theirs.config._attn_implementation
    assert torch.equal(output(model, inputs), output(theirs, inputs))


def test_a_sub_config_override_updates_it_and_a_bad_value_is_named(tmp_path):
    """A dict for a sub-config updates its fields, as transformers' ``from_dict`` does (the
    other fields kept); a value the config refuses names the override (was: every override
    refused; a bad one would have read as the file's fault)."""
    from tests.interop.matrix import FAMILIES

    cls, cfg, inputs = FAMILIES["llava"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path)
    theirs = pretrained(cls, tmp_path, text_config={"use_cache": False})
    model = weightplan.from_pretrained(tmp_path, text_config={"use_cache": False})
    for config in (model.config.text_config, theirs.config.text_config):
        assert config.use_cache is False and config.hidden_size == cfg.text_config.hidden_size
    assert type(model.config.text_config) is type(theirs.config.text_config)
    assert torch.equal(output(model, inputs), output(theirs, inputs))
    with pytest.raises(ArgumentError, match=r"from_pretrained\(num_labels=...\): .* refuses"):
        weightplan.from_pretrained(tmp_path, num_labels="three")
