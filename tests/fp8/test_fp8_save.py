"""Saving FP8 models: kept FP8 saves back bit for bit; a dequantized model saves at its
own dtype without scales by default, or re-quantized with ``quantize="fp8"``."""

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from tests.fp8.oracle import bits
from tests.fp8.test_fp8_interop import meta_model
from weightplan.errors import SaveError
from weightplan.planner.core.quant.blocks import dequantize


def saved(directory):
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


@pytest.mark.parametrize("name", ["dsv3", "mixtral"])
def test_kept_fp8_saves_back_bit_for_bit(fp8_checkpoints, tmp_path, name):
    _, fp8_dir = fp8_checkpoints(name)
    model = meta_model(name, fp8=True)
    weightplan.explain(model, fp8_dir, dtype=torch.bfloat16).execute()
    weightplan.save(model, tmp_path / "out")
    original, written = load_file(str(fp8_dir / "model.safetensors")), saved(tmp_path / "out")
    assert set(written) == set(original)
    for key, value in original.items():
        if key.endswith("e_score_correction_bias"):  # fp32 in the model, bf16 in our fixture
            continue
        assert written[key].dtype == value.dtype and torch.equal(bits(written[key]), bits(value)), key


def test_dequantized_model_saves_its_own_dtype_without_scales(fp8_checkpoints, tmp_path):
    _, fp8_dir = fp8_checkpoints("mixtral")
    model = meta_model("mixtral")
    weightplan.explain(model, fp8_dir, dtype=torch.bfloat16).execute()
    weightplan.save(model, tmp_path / "out")
    original, written = load_file(str(fp8_dir / "model.safetensors")), saved(tmp_path / "out")
    assert set(written) == {k for k in original if not k.endswith("_scale_inv")}
    key = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    assert written[key].dtype == torch.bfloat16
    expected = dequantize(original[key], original[key + "_scale_inv"], (128, 128), torch.bfloat16)
    assert torch.equal(written[key], expected)
    again = meta_model("mixtral")
    weightplan.explain(again, tmp_path / "out", dtype=torch.bfloat16).execute()
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


def test_dequantized_model_saved_requantized(fp8_checkpoints, tmp_path):
    _, fp8_dir = fp8_checkpoints("dsv3")
    model = meta_model("dsv3")
    weightplan.explain(model, fp8_dir, dtype=torch.bfloat16).execute()
    plan = weightplan.explain_save(model, tmp_path / "out", quantize="fp8")
    assert "quantize 128×128 → f8_e4m3 + scale" in str(plan)
    [note] = [n.message for n in plan.notes if "quantization_config" in n.message]
    assert '"quant_method": "fp8"' in note and '"weight_block_size": [128, 128]' in note
    plan.execute()
    original, written = load_file(str(fp8_dir / "model.safetensors")), saved(tmp_path / "out")
    assert set(written) == set(original)
    for key, value in original.items():
        if value.dtype == torch.float8_e4m3fn:  # quantizing a dequantized weight: same bytes
            assert torch.equal(bits(written[key]), bits(value)), key
            scale = original[key + "_scale_inv"]
            assert torch.allclose(written[key + "_scale_inv"], scale, rtol=2 ** -20, atol=0), key


def test_quantize_option_is_checked(tmp_path):
    model = meta_model("mixtral")
    with pytest.raises(SaveError, match="quantize='int4'"):
        weightplan.explain_save(model, tmp_path / "out", quantize="int4")


def _quantization_config(directory):
    import json

    return json.loads((directory / "config.json").read_text()).get("quantization_config")


def test_saved_config_says_what_the_shards_hold(fp8_checkpoints, tmp_path):
    """config.json's quantization_config matches what was written: kept FP8 keeps it, a
    dequantized model drops it, ``quantize="fp8"`` writes it back."""
    _, fp8_dir = fp8_checkpoints("mixtral")
    kept = meta_model("mixtral", fp8=True)
    weightplan.explain(kept, fp8_dir, dtype=torch.bfloat16).execute()
    weightplan.save(kept, tmp_path / "kept")
    config = _quantization_config(tmp_path / "kept")
    assert config["quant_method"] == "fp8" and config["weight_block_size"] == [128, 128]
    plain = meta_model("mixtral")
    weightplan.explain(plain, fp8_dir, dtype=torch.bfloat16).execute()
    # as when built from the FP8 checkpoint's config.json: the config still says FP8
    plain.config.quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
                                        "weight_block_size": [128, 128]}
    weightplan.save(plain, tmp_path / "plain")
    assert _quantization_config(tmp_path / "plain") is None
    weightplan.save(plain, tmp_path / "requantized", quantize="fp8")
    assert _quantization_config(tmp_path / "requantized")["quant_method"] == "fp8"


def test_a_model_quantized_on_load_saves_its_weights_dequantized(fp8_checkpoints, tmp_path):
    """The inverse of a quantize is a dequantize: a floating checkpoint loaded into FP8
    parameters is written back in its own layout and keys, each FP8 weight dequantized with
    its scale (before the inverse ops: fused experts split back per expert)."""
    bf16_dir, _ = fp8_checkpoints("dsv3")
    model = meta_model("dsv3", fp8=True)
    weightplan.explain(model, bf16_dir).execute()
    plan = weightplan.explain_save(model, tmp_path / "out")
    assert "dequantize 128×128 → bf16" in str(plan)
    plan.execute()
    original, written = load_file(str(bf16_dir / "model.safetensors")), saved(tmp_path / "out")
    assert set(written) == set(original)
    state = model.state_dict()

    def back(name):
        return dequantize(state[name], state[name + "_scale_inv"], (128, 128), torch.bfloat16)

    assert all(written[k].dtype == v.dtype and written[k].shape == v.shape
               for k, v in original.items())
    key = "model.layers.0.mlp.down_proj.weight"
    assert state[key].dtype == torch.float8_e4m3fn and torch.equal(written[key], back(key))
    fused = back("model.layers.1.mlp.experts.gate_up_proj")
    half = fused.shape[1] // 2
    for e in range(fused.shape[0]):
        gate = written[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"]
        assert torch.equal(gate, fused[e, :half]) and torch.equal(
            written[f"model.layers.1.mlp.experts.{e}.up_proj.weight"], fused[e, half:])
    kept = "model.layers.0.input_layernorm.weight"  # not quantized: bit for bit
    assert torch.equal(bits(written[kept]), bits(original[kept]))
