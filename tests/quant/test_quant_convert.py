"""``weightplan convert SRC DST --dequantize``: a floating copy of a quantized checkpoint,
every dequantized tensor equal to the oracle's, its parts gone, its config unquantized."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.fp8.test_fp8_interop import same
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.test_quant_mxfp4 import gptoss  # noqa: F401 (fixture)
from weightplan.cli import main

pytest.importorskip("compressed_tensors")


def _check(out, want):
    got = load_file(str(next(out.glob("*.safetensors"))))
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert same(got[key], tensor), key
    assert "quantization_config" not in json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("kind", ["int", "nvfp4"])
def test_convert_dequantize_compressed_tensors(tmp_path, kind, capsys):
    qdir, odir = quantized_checkpoint(tmp_path, kind)
    out = tmp_path / "out"
    assert main(["convert", str(qdir), str(out), "--dequantize"]) == 0
    assert "dequantize" in capsys.readouterr().out
    _check(out, load_file(str(odir / "model.safetensors")))


def test_convert_dequantize_mxfp4(tmp_path, gptoss):  # noqa: F811
    qdir, expected = gptoss
    out = tmp_path / "out"
    assert main(["convert", str(qdir), str(out), "--dequantize"]) == 0
    _check(out, expected)


def test_convert_dequantize_refuses_plain_checkpoints(tmp_path):
    from weightplan.errors import QuantizationError
    from safetensors.torch import save_file

    (tmp_path / "c").mkdir()
    save_file({"a": torch.ones(2)}, str(tmp_path / "c" / "model.safetensors"))
    import weightplan
    with pytest.raises(QuantizationError, match="nothing to dequantize"):
        weightplan.explain_convert(tmp_path / "c", tmp_path / "o", dequantize=True)


def test_convert_dequantize_names_file_then_key_once(tmp_path, capsys):
    """A block-FP8 scale that doesn't fit: the one error line names the file, then the key,
    once each (was: the key, then the file, then the key again)."""
    from tests.fp8.test_fp8_pairing import fp8_checkpoint

    (tmp_path / "c").mkdir()
    fp8_checkpoint(tmp_path / "c", **{"a.q_proj.weight_scale_inv": torch.ones(1, 2)})
    assert main(["convert", str(tmp_path / "c"), str(tmp_path / "o"), "--dequantize"]) == 5
    err = capsys.readouterr().err
    file = tmp_path / "c" / "model.safetensors"
    assert f"can't dequantize: {file}: a.q_proj.weight_scale_inv is [1, 2] but" in err, err
    assert err.count("a.q_proj.weight_scale_inv") == 1, err
