"""transformers' ``from_pretrained`` keywords: the ones with a meaning here do it, the others
are an ArgumentError that says what to do (never a TypeError naming another function), and
a status line covers the seconds before the progress bar."""

import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightplan
from weightplan.api.keywords import AUTOMATIC, REFUSED
from weightplan.errors import ArgumentError, ModelBuildError, PlanError

from tests.interop.matrix import output, pretrained


def test_torch_dtype_is_dtype_with_transformers_deprecation(llama):
    directory, _, _ = llama
    with pytest.warns(FutureWarning, match=r"torch_dtype=.*deprecated.*use dtype="):
        model = weightplan.from_pretrained(directory, torch_dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with pytest.warns(FutureWarning), pytest.raises(ArgumentError, match="pass dtype= only"):
        weightplan.from_pretrained(directory, dtype=torch.float16, torch_dtype=torch.bfloat16)


def test_dtype_none_is_auto_as_in_transformers(llama, tmp_path):
    """transformers 5 reads ``dtype=None`` (and ``torch_dtype=None``) as ``"auto"``: a bf16
    checkpoint loads in bf16 (was: float32 here, twice the memory and another model than
    the migrated code got); ``dtype=None`` beside ``torch_dtype=`` takes the latter."""
    directory, cls, _ = llama
    bf16 = tmp_path / "bf16"
    pretrained(cls, directory).to(torch.bfloat16).save_pretrained(bf16)
    theirs = pretrained(cls, bf16, dtype=None)
    assert next(theirs.parameters()).dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for kwargs in ({"dtype": None}, {"torch_dtype": None}, {"dtype": None, "torch_dtype": None}):
            model = weightplan.from_pretrained(bf16, **kwargs)
            assert {p.dtype for p in model.parameters()} == {torch.bfloat16}, kwargs
        model = weightplan.from_pretrained(bf16, dtype=None, torch_dtype=torch.float16)
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def test_device_map_is_the_device(llama):
    directory, cls, inputs = llama
    reference = output(pretrained(cls, directory), inputs)
    for device_map in ("cpu", {"": "cpu"}, {"model.layers.0": "cpu", "": torch.device("cpu")}):
        model = weightplan.from_pretrained(directory, device_map=device_map)
        assert torch.equal(output(model, inputs), reference)
        assert {p.device.type for p in model.parameters()} == {"cpu"}


@pytest.mark.parametrize("strategy", AUTOMATIC)
def test_automatic_placement_loads(strategy, llama):
    directory, cls, inputs = llama
    model = weightplan.from_pretrained(directory, device_map=strategy,
                                       max_memory={"cpu": "1GiB"})
    assert torch.equal(output(model, inputs), output(pretrained(cls, directory), inputs))
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_device_map_that_cannot_mean_a_device(llama):
    directory, _, _ = llama
    with pytest.raises(PlanError, match="lies inside the whole model"):  # (dispatch fails it)
        weightplan.from_pretrained(directory, device_map={"model.layers.0": "disk", "": "cpu"},
                                   offload_folder=directory / "offload")
    with pytest.raises(ArgumentError, match="not both"):
        weightplan.from_pretrained(directory, device_map="cpu", device="cpu")


def test_remote_code_and_low_memory_keywords(llama):
    directory, _, _ = llama
    with pytest.raises(ArgumentError, match="remote code never runs"):
        weightplan.from_pretrained(directory, trust_remote_code="yes")
    # the values that ask for what weightplan does anyway are taken (transformers 5 ignores
    # low_cpu_mem_usage and _fast_init, and trust_remote_code on a class it has built in:
    # code written for it loads here too; tests/interop/test_pretrained_migration.py)
    weightplan.from_pretrained(directory, trust_remote_code=True, use_safetensors=True,
                               low_cpu_mem_usage=False, _fast_init=True)


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_every_refused_keyword_says_what_to_do(keyword):
    with pytest.raises(ArgumentError) as caught:
        weightplan.from_pretrained("no/such-checkpoint", **{keyword: object()})
    assert f"from_pretrained({keyword}=" in str(caught.value)
    assert REFUSED[keyword].advice in str(caught.value)


def test_an_unknown_keyword_is_not_a_type_error_about_explain(llama):
    """One the config has no attribute for (transformers: its model's ``__init__`` gets it,
    a TypeError there) is an ArgumentError naming it; a near miss of a keyword is told it,
    before any work (was: every config override refused, ``output_hidden_states=True``)."""
    directory, _, _ = llama
    with pytest.raises(ArgumentError) as caught:
        weightplan.from_pretrained(directory, hidden_states_out=True)
    assert "hidden_states_out=True" in str(caught.value) and "explain()" not in str(caught.value)
    assert "not an attribute of LlamaConfig" in str(caught.value)
    for typo, meant in (("dtpye", "dtype"), ("device_mapp", "device_map"),
                        ("local_file_only", "local_files_only"), ("torch_type", "torch_dtype")):
        with pytest.raises(ArgumentError, match=f"did you mean {meant}=") as caught:
            weightplan.from_pretrained("no/such-checkpoint", **{typo: "auto"})
        assert "not an attribute" not in str(caught.value)
    with pytest.raises(ArgumentError, match="weightplan.load"):
        weightplan.from_pretrained(torch.nn.Linear(2, 2))
    with pytest.raises(ArgumentError, match="not both"):
        weightplan.from_pretrained(directory, return_report=True, output_loading_info=True)


def test_a_refused_value_is_named_in_one_short_line(llama):
    """from_pretrained(dir, config=cfg) named the config by its repr: 40 lines of JSON."""
    directory, cls, _ = llama
    config = cls.config_class.from_pretrained(directory)
    with pytest.raises(ArgumentError) as caught:
        weightplan.from_pretrained(directory, config=config)
    message = str(caught.value)
    assert message.startswith(f"from_pretrained(config={type(config).__name__}(...)): the "
                              "model is built from the checkpoint's config.json"), message
    assert "\n" not in message and len(message) < 400, message
    with pytest.raises(ArgumentError, match=r"got attentions_out=True: not an") as caught:
        weightplan.from_pretrained(directory, attentions_out=True)  # short: as it is
    with pytest.raises(ArgumentError) as caught:
        weightplan.from_pretrained(directory, extra_config=config)  # (no attribute)
    assert f"got extra_config={type(config).__name__}(...): not an" in str(caught.value)


def test_attention_implementation_and_generation_config(llama):
    directory, _, _ = llama
    from transformers import GenerationConfig

    model = weightplan.from_pretrained(directory, attn_implementation="eager",
                                       generation_config=GenerationConfig(max_new_tokens=3))
    assert model.config._attn_implementation == "eager"
    assert model.generation_config.max_new_tokens == 3
    with pytest.raises(ModelBuildError):
        weightplan.from_pretrained(directory, attn_implementation="no-such-attention")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, "auto"])
def test_the_config_says_the_dtype_loaded_as_transformers_sets_it(dtype, llama):
    """``model.config.dtype`` (and a composite's sub-configs') is the dtype the model was
    loaded in (was: config.json's, float32 for a model loaded in float16)."""
    directory, cls, _ = llama
    ours = weightplan.from_pretrained(directory, dtype=dtype)
    theirs = pretrained(cls, directory, dtype=dtype)
    assert ours.config.dtype == theirs.config.dtype == next(ours.parameters()).dtype
    from transformers import LlavaConfig, LlamaConfig

    config = LlavaConfig(text_config=LlamaConfig(**ours.config.to_dict()))
    composite = torch.nn.Module()
    composite.config = config
    from weightplan.api.pretrained import _record_dtype

    _record_dtype(composite, torch.float16)
    assert config.dtype == config.text_config.dtype == config.vision_config.dtype == \
        torch.float16


def test_output_loading_info_is_transformers_dict(llama, tmp_path):
    directory, _, _ = llama
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["model.norm.weight"]
    tensors["extra.weight"] = torch.zeros(2)
    (tmp_path / "c").mkdir()
    save_file(tensors, str(tmp_path / "c" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "c" / "config.json").write_bytes((directory / "config.json").read_bytes())
    model, info = weightplan.from_pretrained(tmp_path / "c", output_loading_info=True)
    assert info == {"missing_keys": {"model.norm.weight"}, "unexpected_keys": {"extra.weight"},
                    "mismatched_keys": set(), "error_msgs": []}


def test_a_subfolder_of_a_directory(llama, tmp_path):
    directory, cls, inputs = llama
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    for f in directory.iterdir():
        (tmp_path / "repo" / "sub" / f.name).write_bytes(f.read_bytes())
    model = weightplan.from_pretrained(tmp_path / "repo", subfolder="sub")
    assert torch.equal(output(model, inputs), output(pretrained(cls, directory), inputs))


def test_a_status_line_until_the_progress_bar(llama, capsys):
    directory, _, _ = llama
    weightplan.from_pretrained(directory, progress=True)
    err = capsys.readouterr().err
    built, planned = err.find("built the model in "), err.find("planned the load in ")
    assert 0 <= built < planned < err.find("loading")
    with warnings.catch_warnings():
        weightplan.from_pretrained(directory, progress=False)
    assert capsys.readouterr().err == ""


# transformers 5's from_pretrained keywords at their defaults (its signature and the
# kwargs.pop defaults of its body): code that passes them through (variant=args.variant,
# config=None) asks for nothing and loads as without them
TRANSFORMERS_DEFAULTS = dict(
    config=None, cache_dir=None, ignore_mismatched_sizes=False, force_download=False,
    local_files_only=False, token=None, revision="main", use_safetensors=None,
    weights_only=True, fusion_config=None, disable_mmap=None, state_dict=None, proxies=None,
    tqdm_class=None, output_loading_info=False, dtype=None, device_map=None, max_memory=None,
    offload_folder=None, offload_buffers=False, quantization_config=None, subfolder="",
    variant=None, adapter_kwargs=None, generation_config=None, gguf_file=None,
    distributed_config=None, device_mesh=None, tp_plan=None, tp_size=None,
    trust_remote_code=None, allow_all_kernels=False, use_kernels=None, kernel_config=None,
    kernels_mode=None, key_mapping=None)


def test_transformers_defaults_load_as_without_them(llama):
    """Was: ``variant=None``, ``config=None``, ``key_mapping=None``, ``tp_plan=None``,
    ``quantization_config=None``... refused, so a migrated call that passes its arguments
    through failed; ``ignore_mismatched_sizes=False`` and ``weights_only=True`` were
    refused as config overrides."""
    import inspect

    from transformers import PreTrainedModel

    signature = inspect.signature(PreTrainedModel.from_pretrained).parameters
    for name, value in TRANSFORMERS_DEFAULTS.items():  # (the table matches transformers)
        assert name not in signature or signature[name].default == value, name
    directory, cls, inputs = llama
    model = weightplan.from_pretrained(directory, **TRANSFORMERS_DEFAULTS)
    assert torch.equal(output(model, inputs), output(pretrained(cls, directory), inputs))


def test_transformers_private_keywords_are_taken(llama):
    """transformers pops ``_commit_hash`` (read by nothing in 5.x), ``_from_auto`` and
    ``_from_pipeline`` (its Hub user agent), which its auto classes and ``pipeline()``
    pass; were refused as 'config overrides are not applied', which they aren't."""
    directory, cls, inputs = llama
    model = weightplan.from_pretrained(directory, _commit_hash="0" * 40, _from_auto=True,
                                       _from_pipeline="text-generation")
    assert torch.equal(output(model, inputs), output(pretrained(cls, directory), inputs))


@pytest.mark.parametrize("keyword, value, says", [
    ("ignore_mismatched_sizes", True, "plan.mismatched"),
    ("weights_only", False, "nothing is unpickled"),
    ("disable_mmap", False, "read straight into place"),
    ("fusion_config", {"patch_embeddings": True}, "fusion patches are not applied"),
    ("tqdm_class", object, "progress="),
    ("allow_all_kernels", True, "hub kernels are not loaded"),
    ("config", "other/config.json", "built from the checkpoint's config.json")])
def test_a_transformers_keyword_is_refused_for_what_it_is(keyword, value, says, llama):
    """A keyword of transformers' own from_pretrained, given a value that asks for
    something, says what to do: was 'config overrides are not applied' for all but a few."""
    directory, _, _ = llama
    with pytest.raises(ArgumentError) as caught:
        weightplan.from_pretrained(directory, **{keyword: value})
    assert says in str(caught.value) and "not an attribute" not in str(caught.value)


def test_a_dtype_per_sub_config_is_taken_as_transformers_takes_it(tmp_path):
    """transformers 5 takes ``dtype={sub-config: dtype, "": dtype}`` (deprecated): every
    module in ``dtype[""]`` (its default dtype when absent), with a warning. Was: PlanError
    'unknown dtype {...}'."""
    from tests.interop.matrix import FAMILIES as ALL

    cls, cfg, inputs = ALL["llava"]()
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path)
    for dtype, loaded in (({"text_config": torch.bfloat16, "": torch.float16}, torch.float16),
                          ({"text_config": "bfloat16"}, torch.float32),
                          ({"": "bfloat16"}, torch.bfloat16)):
        with pytest.warns(FutureWarning, match="per sub-config"):
            model = weightplan.from_pretrained(tmp_path, dtype=dtype)
        theirs = pretrained(cls, tmp_path, dtype=dtype)
        assert {p.dtype for p in model.parameters()} == {loaded}, dtype
        assert torch.equal(output(model, inputs), output(theirs, inputs))


def test_tp_plan_auto_is_tp_auto_with_transformers_deprecation(llama):
    """transformers 5.25 still takes ``tp_plan="auto"`` (a FutureWarning): was an
    ArgumentError 'pass tp='auto''; now it is ``tp="auto"`` (the same checks, the same
    load: under torchrun, tests/parallel); a dict plan is refused saying what to do."""
    from weightplan.api.keywords import fold_transformers_keywords

    directory, _, _ = llama
    with pytest.warns(FutureWarning, match="tp_plan='auto'.*use tp='auto'"):
        assert fold_transformers_keywords({"tp_plan": "auto"}, None).tp == "auto"
    with pytest.warns(FutureWarning), pytest.raises(ArgumentError, match="drop device_map"):
        weightplan.from_pretrained(directory, tp_plan="auto", device_map="cpu")
    with pytest.raises(ArgumentError, match=r"TensorParallel\(plan="):
        weightplan.from_pretrained(directory, tp_plan={"model.layers.*.mlp.up_proj": "colwise"})
    with pytest.raises(ArgumentError, match="pass tp= only"):
        weightplan.from_pretrained(directory, tp_plan="auto", tp=weightplan.TensorParallel())
