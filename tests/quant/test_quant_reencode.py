"""MXFP4 → block FP8, losslessly: random E2M1 codes and E8M0 scales (extreme exponents
included) re-encoded as 128×128 E4M3 tiles with power-of-two float32 scales dequantize to
the very bits the MXFP4 dequantizes to; a tile whose values span more binades than E4M3
holds is refused with a typed error; ``weightplan convert SRC DST --to fp8`` on gpt-oss
writes a block-FP8 checkpoint whose dequantized copy equals transformers' MXFP4
dequantizer's tensors."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from tests.fp8.test_fp8_interop import same
from tests.quant.makers import nibbles
from tests.quant.test_quant_mxfp4 import gptoss  # noqa: F401 (fixture)
from weightplan.cli import main
from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.formats import Scheme, dequantize
from weightplan.planner.core.quant.quantize import quantize


def _mxfp4(rows: int, groups: int, low: int, span: int, seed: int):
    """Random codes, and scale bytes in ``[low, low + span]`` (an E8M0 exponent window)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, groups * 32), generator=g)
    scales = torch.randint(low, low + span + 1, (rows, groups), generator=g).to(torch.uint8)
    return nibbles(codes).reshape(rows, groups, 16), scales


def _round_trip(blocks, scales):
    rows, groups = scales.shape
    want = dequantize(Scheme("mxfp4"), [blocks, scales], (rows, groups * 32), torch.bfloat16)
    q, s = quantize(want, (128, 128), scale_fmt="exact")
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert bool((torch.frexp(s)[0] == 0.5).all()), "scales are powers of two"
    # DeepSeek's block FP8: W = fp8 · weight_scale_inv per 128×128 tile, in fp32
    got = (q.float() * s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :groups * 32]
           ).to(torch.bfloat16)
    return want, got


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 300), groups=st.integers(1, 9), span=st.integers(0, 14),
       low=st.sampled_from([0, 1, 60, 120, 127, 200, 238]), seed=st.integers(0, 2**31))
def test_reencode_is_lossless_within_fourteen_binades(rows, groups, span, low, seed):
    """Any tile whose scale exponents span ≤ 14 binades is exact (6·2^e at the top, 0.5·2^e'
    at the bottom: E4M3 holds 2^-9 … 448), down to E8M0's 2^-127 and up to 2^111·6."""
    blocks, scales = _mxfp4(rows, groups, low, span, seed)
    want, got = _round_trip(blocks, scales)
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))


def test_reencode_top_of_range():
    blocks, scales = _mxfp4(130, 5, 252 - 14, 14, 7)  # 6·2^125: bf16's top binade
    want, got = _round_trip(blocks, scales)
    assert torch.isfinite(want.float()).all()
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))


def test_reencode_refuses_a_tile_too_wide():
    """Exponents 2^20 and 2^-20 in one tile, with a 6 and a 0.5: no E4M3 scale holds both."""
    codes = torch.zeros(2, 32, dtype=torch.int64)
    codes[0, 0], codes[1, 0] = 7, 1  # 6 and 0.5
    blocks = nibbles(codes).reshape(2, 1, 16)
    scales = torch.tensor([[127 + 20], [127 - 20]], dtype=torch.uint8)
    w = dequantize(Scheme("mxfp4"), [blocks, scales], (2, 32), torch.bfloat16)
    with pytest.raises(QuantizationError, match=r"block \(0, 0\) can't be re-encoded exactly"):
        quantize(w, (128, 128), scale_fmt="exact")


def test_convert_to_fp8_gptoss(tmp_path, gptoss, capsys):  # noqa: F811
    qdir, expected = gptoss
    out, back = tmp_path / "fp8", tmp_path / "bf16"
    assert main(["convert", str(qdir), str(out), "--to", "fp8"]) == 0
    text = capsys.readouterr().out
    assert "quantize" in text, text
    got = load_file(str(next(out.glob("*.safetensors"))))
    key = "model.layers.0.mlp.experts.gate_up_proj"
    assert got[key].dtype == torch.float8_e4m3fn and tuple(got[key].shape) == (4, 64, 192)
    assert got[key + "_scale_inv"].dtype == torch.float32
    assert tuple(got[key + "_scale_inv"].shape) == (4, 1, 2)
    assert not any(k.endswith(("_blocks", "_scales")) for k in got)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fp8" and config["weight_block_size"] == [128, 128]
    assert main(["convert", str(out), str(back), "--dequantize"]) == 0
    deq = load_file(str(next(back.glob("*.safetensors"))))
    assert sorted(deq) == sorted(expected)
    for k, want in expected.items():
        assert same(deq[k], want), k


def test_convert_to_fp8_refuses_other_formats(tmp_path):
    from tests.quant.checkpoints import quantized_checkpoint
    import weightplan

    pytest.importorskip("compressed_tensors")
    qdir, _ = quantized_checkpoint(tmp_path, "int")
    with pytest.raises(QuantizationError, match="nothing to re-encode"):
        weightplan.explain_convert(qdir, tmp_path / "o", to="fp8")
    with pytest.raises(QuantizationError, match="re-encodes MXFP4 as 'fp8'"):
        weightplan.explain_convert(qdir, tmp_path / "o", to="int4")


def test_an_inexact_tile_of_a_checkpoint_names_file_key_and_expert(tmp_path, gptoss):  # noqa: F811
    """A tile too wide for E4M3 in expert 1 of a fused stack: the error names the source
    file, the tensor and the tile with its expert (not block (0, 0) of an unnamed file);
    the failed convert leaves no file behind."""
    import shutil

    from safetensors.torch import save_file

    import weightplan

    qdir, _ = gptoss
    bad = tmp_path / "wide"
    shutil.copytree(qdir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    key = "model.layers.1.mlp.experts.down_proj"
    scales = tensors[key + "_scales"].clone()
    scales[1, 0, 0], scales[1, 1, 0] = 127 + 30, 127 - 30  # (rows 0 and 1 of one tile)
    tensors[key + "_scales"] = scales
    save_file(tensors, str(bad / "model.safetensors"))
    out = tmp_path / "out"
    with pytest.raises(QuantizationError) as info:
        weightplan.explain_convert(bad, out, to="fp8").execute()
    text = str(info.value)
    assert str(bad / "model.safetensors") in text and key in text, text
    assert "block (1, 0, 0)" in text, text
    assert not out.exists()  # (the directory it created removed too)
