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
