"""Keep-quantized without a model: ``weightplan convert SRC DST --mapping M`` and
``weightplan.convert(dict, M)`` carry a quantized checkpoint's stored tensors (packed
bytes, scales, zero points, ``weight_shape``, global scales) through the mapping as they
are, each under its own suffix, merged like their weights (per-expert → fused experts);
the reverse gives the original tensors back bit for bit, ModelOpt's ``()``
``weight_scale_2`` included. What a mapping can't do to a stored role is an error naming
it, at plan time."""

from __future__ import annotations

import json

import pytest
import torch

import weightplan
from tests.quant.checkpoints import quantized_checkpoint
from tests.quant.test_quant_keep import _as_grids, _bits, _file_tensors, _fused
from weightplan.cli import main

pytest.importorskip("compressed_tensors")

KINDS = ["int", "int-asym", "fp8-channel", "fp8-block", "nvfp4", "modelopt"]


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, t in want.items():
        assert got[key].dtype == t.dtype and tuple(got[key].shape) == tuple(t.shape), key
        assert _bits(got[key]) == _bits(t), key


@pytest.mark.parametrize("kind", KINDS)
def test_convert_keeps_quantized_through_merges(tmp_path, kind):
    """Per-expert stored parts → the fused layout (each role stacked, gate/up concatenated;
    ModelOpt's ``()`` global scales as ``(E, 1)`` / ``(E, 2)`` grids), bit for bit; the
    reverse conversion writes the per-expert file back bit for bit."""
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    stored = _file_tensors(qdir)
    out, back = tmp_path / "fused", tmp_path / "back"
    weightplan.explain_convert(qdir, out, mapping="qwen3_moe").execute()
    _same(_file_tensors(out), _fused(_as_grids(stored)))
    copied = {p.name for p in out.glob("*.json")}
    assert "config.json" in copied and ("hf_quant_config.json" in copied) == (kind == "modelopt")
    assert json.loads((out / "config.json").read_text()).get("quantization_config") \
        == json.loads((qdir / "config.json").read_text()).get("quantization_config")
    weightplan.explain_convert(out, back, mapping="qwen3_moe", reverse=True).execute()
    _same(_file_tensors(back), stored)


def test_cli_convert_keeps_modelopt(tmp_path, capsys):
    """The same through the CLI: ``convert --mapping`` and ``--reverse``."""
    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    stored = _file_tensors(qdir)
    out, back = tmp_path / "fused", tmp_path / "back"
    assert main(["convert", str(qdir), str(out), "--mapping", "qwen3_moe"]) == 0
    text = capsys.readouterr().out
    assert "Reshape(shape=(1,)) → MergeModulelist(dim=0) → Concatenate(dim=1)" in text, text
    assert "gate_up_proj_scale_2  f32[4, 2]" in text, text
    assert main(["convert", str(out), str(back), "--mapping", "qwen3_moe", "--reverse"]) == 0
    _same(_file_tensors(back), stored)


@pytest.mark.parametrize("kind", ["int", "nvfp4", "modelopt"])
def test_convert_dict_keeps_quantized(tmp_path, kind):
    """``weightplan.convert`` of the stored tensors: the fused layout bit for bit;
    ``revert`` gives them back bit for bit, from its record and (a plain dict) from the
    mapping's inverse."""
    qdir, _ = quantized_checkpoint(tmp_path, kind)
    stored = _file_tensors(qdir)
    out = weightplan.convert(stored, "qwen3_moe")
    _same(dict(out), _fused(_as_grids(stored)))
    _same(weightplan.revert(out, "qwen3_moe"), stored)
    _same(weightplan.revert(dict(out), "qwen3_moe"), stored)


def test_convert_refuses_splitting_a_global_scale(tmp_path):
    """A mapping that splits a fused ModelOpt weight into three: its packed bytes and block
    scales split by rows, but one per-tensor ``weight_scale_2`` can't be cut in three —
    an error at plan time naming the target, not a guess."""
    from weightplan.errors import OpError
    from weightplan.ops import Chunk

    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    stored = _file_tensors(qdir)
    fused = {k: v for k, v in stored.items() if ".self_attn.q_proj." in k and ".layers.0." in k}
    fused = {k.replace("q_proj", "qkv_proj"): v for k, v in fused.items()}
    split = weightplan.WeightConverter(
        "self_attn.qkv_proj.weight",
        ["self_attn.q.weight", "self_attn.k.weight", "self_attn.v.weight"],
        operations=[Chunk(0, sizes=(128, 64, 64))])
    with pytest.raises(OpError, match=r"weight_scale_2"):
        weightplan.convert(fused, [split])


def test_save_of_an_unloaded_fused_model_gives_modelopt_scalars_back(tmp_path):
    """A fused model weightplan never loaded (no record), saved with the mapping's
    inverse: its ``(E, 2)`` / ``(E, 1)`` global scales split back into each expert's
    ``()`` ``weight_scale_2`` (ModelOpt's own shape), every tensor bit for bit."""
    from tests.hostile.helpers import meta_model

    qdir, _ = quantized_checkpoint(tmp_path, "modelopt")
    stored = _file_tensors(qdir)
    fused = _fused(_as_grids(stored))
    model = meta_model(fused).to_empty(device="cpu")
    with torch.no_grad():
        for key, t in model.state_dict().items():
            t.copy_(fused[key])
    weightplan.save(model, tmp_path / "saved", mapping="qwen3_moe")
    _same(_file_tensors(tmp_path / "saved"), stored)
