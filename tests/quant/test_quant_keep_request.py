"""Keeping a quantized checkpoint as stored: asked for explicitly (``dequantize=False``) of a
format no model holds here, it is a typed error naming what can be kept (was: a bf16 model
without a word); by default (keep when possible) such a checkpoint loads dequantized as
before. A block-FP8 checkpoint whose model class can't take transformers' FP8 layers
(gpt-oss's biased experts: what ``convert --to fp8`` writes) is planned dequantized with a
note saying why (was: ``ModelBuildError``), and refused only when asked to keep it."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

import weightplan
from tests.fp8.checkpoints import build
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.test_quant_mxfp4 import gptoss  # noqa: F401 (fixture)
from weightplan.cli import main
from weightplan.errors import ModelBuildError, QuantizationError

pytest.importorskip("compressed_tensors")


def _ue8m0(root):
    _, fp8 = build("mixtral", root)
    directory = root / "ue8m0"
    shutil.copytree(fp8, directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"]["scale_fmt"] = "ue8m0"
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
def unkept(request, tmp_path, gptoss):  # noqa: F811
    if request.param == "mxfp4":
        return gptoss[0], "mxfp4"
    if request.param == "ue8m0":
        return _ue8m0(tmp_path), "ue8m0"
    word = "odel" if request.param == "modelopt" else "compressed-tensors"  # (ModelOpt / modelopt)
    return quantized_checkpoint(tmp_path, request.param)[0], word


@pytest.mark.parametrize("unkept", ["mxfp4", "int", "fp8-channel", "modelopt", "ue8m0"], indirect=True)
def test_asking_to_keep_a_format_no_model_holds_is_an_error(unkept):
    directory, word = unkept
    with pytest.raises(QuantizationError) as info:
        weightplan.from_pretrained(directory, progress=False, dequantize=False)
    text = str(info.value)
    assert "dequantize=False" in text and word in text and "block FP8" in text, text
    with warnings.catch_warnings(record=True) as caught:  # the default: dequantized, as before
        warnings.simplefilter("always")
        model = weightplan.from_pretrained(directory, progress=False)
    assert {p.dtype for p in model.parameters()} <= {torch.bfloat16, torch.float32}
    assert not [w for w in caught if "dequantize=False keeps" in str(w.message)]


@pytest.fixture(scope="module")
def gptoss_fp8(tmp_path_factory, gptoss):  # noqa: F811
    out = tmp_path_factory.mktemp("gptoss-fp8") / "fp8"
    assert main(["convert", str(gptoss[0]), str(out), "--to", "fp8"]) == 0
    return out


def test_explain_plans_an_fp8_gptoss_dequantized_with_a_note(gptoss_fp8, capsys):
    capsys.readouterr()
    assert main(["explain", str(gptoss_fp8)]) == 0
    captured = capsys.readouterr()
    assert "FP8Experts does not support bias" in captured.err, captured.err
    assert "planned dequantized" in captured.err
    assert "dequantized to" in captured.out  # the plan's header


def test_from_pretrained_of_an_fp8_gptoss(gptoss_fp8, gptoss, monkeypatch):  # noqa: F811
    """Where FP8 layers run (a GPU: pretended here), the default keeps FP8 when it can: this
    model can't, so it is loaded dequantized with a warning, equal to the MXFP4 oracle."""
    import weightplan.api.pretrained as pretrained

    monkeypatch.setattr(pretrained, "_fp8_runs_here", lambda: True)
    with pytest.warns(UserWarning, match="planned dequantized") as got:
        model = weightplan.from_pretrained(gptoss_fp8, progress=False)
    assert got[0].filename == __file__  # the caller's line (was: weightplan/api/guard.py)
    state = model.state_dict()
    for key, want in gptoss[1].items():
        assert torch.equal(state[key].to(want.dtype), want), key
    with pytest.raises(ModelBuildError, match="FP8Experts does not support bias"):
        weightplan.from_pretrained(gptoss_fp8, progress=False, dequantize=False)
