"""The public API of SPEC §1 is pinned."""

import inspect

import weightplan
import weightplan.ops


def test_exported_names():
    for name in ("explain", "load", "convert", "Plan", "LoadReport", "WeightRenaming",
                 "PrefixChange", "WeightConverter", "register_mapping", "get_mapping",
                 "from_pretrained", "init_empty", "TensorParallel"):
        assert name in weightplan.__all__ and hasattr(weightplan, name), name
    for name in ("Chunk", "Concatenate", "MergeModulelist", "SplitModulelist", "Transpose",
                 "PermuteForRope", "Conv3dToLinear", "LinearToConv3d", "ConversionOp"):
        assert name in weightplan.ops.__all__ and hasattr(weightplan.ops, name), name


def test_explain_signature():
    params = inspect.signature(weightplan.explain).parameters
    assert list(params)[:2] == ["model", "checkpoint"]
    for name, default in (("mapping", None), ("dtype", None), ("budget", None), ("tp", None),
                          ("quantization", None), ("threads", 4)):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default == default


def test_from_pretrained_signature():
    params = inspect.signature(weightplan.from_pretrained).parameters
    assert list(params)[0] == "name_or_path"
    assert params["dtype"].default == "auto" and params["device"].default is None
    assert params["dtype"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["dequantize_on"].default == "auto"  # as explain's
    assert inspect.signature(weightplan.explain).parameters["dequantize_on"].default == "auto"


def test_register_and_get_mapping():
    from weightplan.errors import RegistryError
    t = [weightplan.WeightRenaming("a", "b")]
    weightplan.register_mapping("test_api_mapping", t)
    assert weightplan.get_mapping("test_api_mapping") == t
    try:
        weightplan.register_mapping("test_api_mapping", [])
    except RegistryError as e:
        assert "overwrite=True" in str(e)
    else:
        raise AssertionError("re-registering without overwrite must raise")
    weightplan.register_mapping("test_api_mapping", [], overwrite=True)
    assert weightplan.get_mapping("test_api_mapping") == []
    assert weightplan.get_mapping("minimax") == weightplan.get_mapping("mixtral")


def test_transformers_words_get_weightplans_word_in_explain_and_load(tmp_path):
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError
    from tests.conftest import write_checkpoint

    directory = write_checkpoint(tmp_path / "c", {"weight": torch.ones(2, 2)})
    model = torch.nn.Linear(2, 2, bias=False)
    for call, keyword, says in [(weightplan.explain, "torch_dtype", "dtype="),
                                (weightplan.load, "torch_dtype", "dtype="),
                                (weightplan.explain, "tp_plan", "tp='auto'"),
                                (weightplan.explain, "adapter", "adapter_name=")]:
        with pytest.raises(ArgumentError) as e:
            call(model, directory, **{keyword: "x"})
        assert f"({keyword}=...)" in str(e.value) and says in str(e.value)
        assert "->" not in str(e.value)  # the fix, not the whole signature



def test_save_pretrained_words_get_what_save_does(tmp_path):
    """transformers' save_pretrained keywords said in save's terms: was 'save(state_dict=...):
    to load a dict of tensors … weightplan.load(model, state_dict)' and 'save(variant=...):
    … weightplan.load(model, [paths])' (from_pretrained's advice), 'save(torch_dtype=...):
    the dtype is dtype=' (save has none), and the rest no reason at all."""
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError

    model = torch.nn.Linear(2, 2, bias=False)
    for keyword, value, says in [
            ("state_dict", {}, "load the dict into the model first"),
            ("variant", "fp16", "no variant"), ("safe_serialization", False, "only safetensors"),
            ("push_to_hub", True, "not done"), ("push_to_hub", True, "hf upload"),
            ("is_main_process", False, "process_group="),
            ("is_main_process", False, "main process only"),
            ("save_original_format", False, "mapping=[]"),
            ("save_function", torch.save, "written by weightplan"),
            ("save_peft_format", False, "peft's format"),
            ("distributed_checkpoint", True, "torch.distributed.checkpoint"),
            ("commit_message", "v2", "option of push_to_hub"), ("repo_id", "a/b", "hf upload"),
            ("create_pr", True, "never uploads"), ("private", True, "never uploads")]:
        for call in (weightplan.save, weightplan.explain_save):
            with pytest.raises(ArgumentError) as e:
                call(model, tmp_path / "out", **{keyword: value})
            assert f"{call.__name__}({keyword}={value!r})" in str(e.value), str(e.value)
            assert says in str(e.value) and "weightplan.load" not in str(e.value), str(e.value)
    with pytest.raises(ArgumentError) as e:
        weightplan.save(model, tmp_path / "out", torch_dtype=torch.float16)
    assert "dtype=" not in str(e.value) and "its keywords: mapping" in str(e.value)

def test_save_variant_is_refused_without_advice_that_breaks_a_sharded_save(tmp_path):
    """Was: "rename them afterwards", which for shards leaves an index whose weight_map
    names the old files (and transformers reads variant shards by its index's name)."""
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError

    with pytest.raises(ArgumentError) as e:
        weightplan.save(torch.nn.Linear(2, 2), tmp_path / "out", variant="fp16")
    assert "rename" not in str(e.value) and "directory of its own" in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_save_pretrained_words_that_ask_for_nothing_are_taken(tmp_path):
    """Was: save(model, dir, safe_serialization=True) refused, as every save_pretrained
    keyword at any value, where from_pretrained takes transformers' harmless values: code
    that passes save_pretrained's arguments through now saves."""
    import torch
    from safetensors.torch import load_file

    import weightplan

    model = torch.nn.Linear(2, 2, bias=False)
    words = dict(safe_serialization=True, is_main_process=True, push_to_hub=False,
                 save_original_format=True, state_dict=None, variant=None, token=None,
                 max_shard_size="50GB", save_peft_format=True, distributed_checkpoint=False,
                 commit_message=None, repo_id=None, create_pr=False, private=None)
    plan = weightplan.explain_save(model, tmp_path / "out", **words)
    assert plan.files == ("model.safetensors",)
    weightplan.save(model, tmp_path / "out", **words)
    assert torch.equal(load_file(tmp_path / "out" / "model.safetensors")["weight"],
                       model.weight.detach())


def test_a_call_that_does_not_bind_names_the_function_called_and_the_fix(tmp_path):
    """Not the whole signature (a wall of a thousand characters ending in the reason): the
    function the user called, the word it is closest to, what goes by keyword."""
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError
    from tests.conftest import write_checkpoint

    directory = write_checkpoint(tmp_path / "c", {"weight": torch.ones(2, 2)})
    model = torch.nn.Linear(2, 2, bias=False)
    for call, name in [(weightplan.explain, "explain"), (weightplan.load, "load")]:
        with pytest.raises(ArgumentError) as e:
            call(model, directory, dtpye=torch.float32)
        text = str(e.value)
        assert text.startswith(f"{name}() got an unexpected keyword argument 'dtpye'"), text
        assert "did you mean dtype=?" in text and "->" not in text
        assert "budget" in text and (name == "explain" or "atomic" in text)  # its own too
    with pytest.raises(ArgumentError) as e:
        weightplan.save(model, tmp_path / "out", compression=True)
    assert "save() got an unexpected keyword argument 'compression'" in str(e.value)
    assert "max_shard_size" in str(e.value) and "->" not in str(e.value)  # its keywords
    with pytest.raises(ArgumentError) as e:
        weightplan.from_pretrained(directory, torch.float32)
    text = str(e.value)
    assert "from_pretrained() takes name_or_path by position" in text, text
    assert "by keyword (its keywords: dtype, " in text and "->" not in text


def test_a_device_map_that_is_neither_device_nor_strategy_names_the_strategies():
    import pytest

    from weightplan.api.keywords import device_from_map
    from weightplan.errors import ArgumentError

    with pytest.raises(ArgumentError, match="device_map='fastest'.*'auto', 'balanced'"):
        device_from_map("fastest", None, None)
    assert device_from_map("cpu", None, None) == "cpu"
    assert device_from_map("auto", None, None) == "auto"


def test_a_misspelling_is_one_everywhere_or_nowhere(tmp_path):
    """One "did you mean" test for ``from_pretrained``'s keywords and a guarded call's:
    ``dtyep`` is ``dtype`` to both; ``devixes`` (0.77 like ``device``) to neither (was:
    ``explain`` suggested ``device=`` at 0.75, ``from_pretrained`` called it a config
    override at 0.8)."""
    import pytest
    import torch

    import weightplan
    from weightplan.errors import ArgumentError, ModelBuildError
    from tests.conftest import write_checkpoint

    directory = write_checkpoint(tmp_path / "c", {"weight": torch.ones(2, 2)})
    model = torch.nn.Linear(2, 2, bias=False)
    for word, close in [("dtyep", "dtype"), ("devixes", None)]:
        texts = []
        with pytest.raises(ArgumentError) as e:
            weightplan.explain(model, directory, **{word: 1})
        texts.append(str(e.value))
        with pytest.raises((ArgumentError, ModelBuildError)) as e:  # (not one: an override,
            weightplan.from_pretrained(directory, **{word: 1})  # and this has no config.json)
        texts.append(str(e.value))
        for text in texts:
            assert (f"did you mean {close}=?" in text) if close else "did you mean" not in text
