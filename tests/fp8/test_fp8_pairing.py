"""Recognising FP8 checkpoints from headers: quantization_config, weight ↔ scale pairs,
typed problems naming the key, both shapes and the expected grid."""

import json

import pytest
import torch
from safetensors.torch import save_file

from weightplan.errors import PlanError, QuantizationError
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.fp8_pairs import Fp8ProblemKind, pair_scales, scale_key
from weightplan.planner.inputs.quant_config import (
    QuantConfig, parse_quant_config, quant_config_of_model, read_quant_config,
)
from weightplan.planner.core.quant.quantize import quantize

DSV3 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128]}


def test_parses_deepseek_v3_config():
    cfg = parse_quant_config(DSV3)
    assert cfg == QuantConfig()
    assert cfg.block == (128, 128) and cfg.scale_fmt == "float" and not cfg.dequantize
    assert parse_quant_config(None) is None
    v31 = parse_quant_config({**DSV3, "scale_fmt": "ue8m0", "weight_block_size": [1, 32],
                              "ignored_layers": ["lm_head", "model.layers.0.mlp.gate"]})
    assert v31.scale_fmt == "ue8m0" and v31.block == (1, 32)
    assert v31.modules_to_not_convert == ("lm_head", "model.layers.0.mlp.gate")
    assert parse_quant_config({"quant_method": "fp8", "weight_block_size": None}).block is None
    assert parse_quant_config({"quant_method": "fp8"}).block == (128, 128)


def test_parses_transformers_config_objects():
    from transformers import FineGrainedFP8Config
    cfg = parse_quant_config(FineGrainedFP8Config(weight_block_size=(64, 32), dequantize=True))
    assert cfg.block == (64, 32) and cfg.dequantize
    model = type("M", (), {"config": type("C", (), {"quantization_config": DSV3})()})()
    assert quant_config_of_model(model) == QuantConfig()


@pytest.mark.parametrize("raw, match", [
    ({"quant_method": "awq"}, "quant_method 'awq' is not supported"),
    ({**DSV3, "weight_block_size": [128]}, "two positive integers"),
    ({**DSV3, "weight_block_size": [0, 128]}, "two positive integers"),
    ({**DSV3, "fmt": "e2m1"}, "fmt"),
    ({**DSV3, "activation_scheme": "weird"}, "activation_scheme"),
    ({**DSV3, "modules_to_not_convert": "lm_head"}, "list of module names"),
    ("fp8", "not an object"),
])
def test_refuses_what_it_cannot_load(raw, match):
    with pytest.raises(QuantizationError, match=match) as info:
        parse_quant_config(raw, source="ckpt/config.json")
    assert isinstance(info.value, PlanError) and "ckpt/config.json" in str(info.value)


def test_an_unsupported_method_names_what_is_read_and_the_file(tmp_path):
    """The refusal lists every method weightplan reads (not FP8 alone) and, for a
    directory whose model was built from its config.json, names that file."""
    import types

    import weightplan
    from tests.conftest import module_with

    with pytest.raises(QuantizationError) as info:
        parse_quant_config({"quant_method": "gptq"}, source="ckpt/config.json")
    for method in ("'fp8'", "'mxfp4'", "'compressed-tensors'", "'modelopt'"):
        assert method in str(info.value), str(info.value)
    raw = {"quant_method": "gptq", "bits": 4}
    save_file({"a.weight": torch.ones(2, 2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": raw}))
    model = module_with({"a.weight": ((2, 2), torch.float32)})
    model.config = types.SimpleNamespace(quantization_config=raw)
    with pytest.raises(QuantizationError) as info:
        weightplan.explain(model, tmp_path)
    assert str(tmp_path / "config.json") in str(info.value), str(info.value)


def test_reads_config_json(tmp_path):
    assert read_quant_config(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x"}))
    assert read_quant_config(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": DSV3}))
    assert read_quant_config(tmp_path).block == (128, 128)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(QuantizationError, match="unreadable config.json"):
        read_quant_config(tmp_path)


def test_modules_to_not_convert_match_like_transformers():
    cfg = parse_quant_config({**DSV3, "modules_to_not_convert": ["lm_head", "layers.1", "mlp.gate"]})
    assert cfg.skips("lm_head") and cfg.skips("model.layers.0.mlp.gate")
    assert not cfg.skips("model.layers.0.mlp.gate_proj")
    assert cfg.skips("layers.1.mlp") and not cfg.skips("layers.11.mlp")


def fp8_checkpoint(tmp_path, **changes):
    tensors = {}
    for key, shape in (("a.q_proj.weight", (192, 256)), ("a.experts.0.up.weight", (128, 64)),
                       ("a.experts.gate_up_proj", (2, 256, 128))):
        q, s = quantize(torch.randn(shape), (128, 128))
        tensors[key], tensors[scale_key(key)] = q, s
    tensors["a.norm.weight"] = torch.ones(256, dtype=torch.bfloat16)
    tensors["a.q_proj.activation_scale"] = torch.tensor(1.0)
    tensors.update(changes)
    tensors = {k: v for k, v in tensors.items() if v is not None}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return open_checkpoint(tmp_path)


def test_pairs_every_fp8_weight_with_its_scale(tmp_path):
    pairing = pair_scales(fp8_checkpoint(tmp_path).entries, QuantConfig())
    assert set(pairing.pairs) == {"a.q_proj.weight", "a.experts.0.up.weight",
                                  "a.experts.gate_up_proj"}
    assert pairing.pairs["a.experts.gate_up_proj"].scale.key == "a.experts.gate_up_proj_scale_inv"
    assert pairing.pairs["a.q_proj.weight"].activation.key == "a.q_proj.activation_scale"
    assert pairing.companions == {"a.q_proj.weight_scale_inv", "a.experts.0.up.weight_scale_inv",
                                  "a.experts.gate_up_proj_scale_inv", "a.q_proj.activation_scale"}
    assert not pairing.problems and pairing.quantized


def test_missing_scale_is_a_problem(tmp_path):
    pairing = pair_scales(fp8_checkpoint(tmp_path, **{"a.q_proj.weight_scale_inv": None}).entries)
    [problem] = pairing.problems
    assert problem.kind is Fp8ProblemKind.MISSING_SCALE and problem.key == "a.q_proj.weight"
    assert problem.weight_shape == (192, 256) and problem.expected == (2, 2)
    assert "a.q_proj.weight_scale_inv" in problem.message and "a.q_proj.weight" not in pairing.pairs
    assert pairing.quantized


@pytest.mark.parametrize("bad", [(1, 2), (2, 1), (192, 256)])
def test_scale_grid_that_does_not_fit_is_a_problem(tmp_path, bad):
    ckpt = fp8_checkpoint(tmp_path, **{"a.q_proj.weight_scale_inv": torch.ones(bad)})
    [problem] = pair_scales(ckpt.entries).problems
    assert problem.kind is Fp8ProblemKind.SCALE_GRID
    assert (problem.key, problem.scale_shape, problem.expected) == (
        "a.q_proj.weight_scale_inv", bad, (2, 2))
    assert f"{list(bad)}" in problem.message and "[192, 256]" in problem.message
    assert "[2, 2]" in problem.message and "weight_block_size" in problem.message


def test_block_from_config_decides_the_grid(tmp_path):
    ckpt = fp8_checkpoint(tmp_path)
    problems = pair_scales(ckpt.entries, QuantConfig(block=(64, 64))).problems
    assert {p.key for p in problems} == {"a.q_proj.weight_scale_inv", "a.experts.0.up.weight_scale_inv",
                                         "a.experts.gate_up_proj_scale_inv"}
    assert all(p.kind is Fp8ProblemKind.SCALE_GRID for p in problems)


def test_scale_dtype_and_stray_scales(tmp_path):
    ckpt = fp8_checkpoint(tmp_path, **{"a.q_proj.weight_scale_inv": torch.ones(2, 2, dtype=torch.int32),
                                       "a.norm.weight_scale_inv": torch.ones(2),
                                       "a.gone.weight_scale_inv": torch.ones(1, 1)})
    kinds = {p.key: p.kind for p in pair_scales(ckpt.entries).problems}
    assert kinds == {"a.q_proj.weight_scale_inv": Fp8ProblemKind.SCALE_DTYPE,
                     "a.norm.weight_scale_inv": Fp8ProblemKind.STRAY_SCALE,
                     "a.gone.weight_scale_inv": Fp8ProblemKind.STRAY_SCALE}


def test_every_problem_names_the_file_of_the_tensor_it_is_about(tmp_path):
    """A sharded checkpoint's reader needs the file as much as the key: each problem's
    message starts with the file holding the tensor it names."""
    file = str(tmp_path / "model.safetensors")
    cases = ({"a.q_proj.weight_scale_inv": None}, {"a.q_proj.weight_scale_inv": torch.ones(1, 2)},
             {"a.q_proj.weight_scale_inv": torch.ones(2, 2, dtype=torch.int32)},
             {"a.norm.weight_scale_inv": torch.ones(2)})
    for changes in cases:
        [problem] = pair_scales(fp8_checkpoint(tmp_path, **changes).entries).problems
        assert problem.message.startswith(f"{file}: {problem.key} "), problem.message


def test_a_one_dim_fp8_weight_names_its_own_file_not_its_scales(tmp_path):
    """Sharded: the message is about the weight (no block grid for 1 dim), so its file."""
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({"a.norm.weight": torch.ones(256).to(torch.float8_e4m3fn)}, str(tmp_path / first))
    save_file({"a.norm.weight_scale_inv": torch.ones(2)}, str(tmp_path / second))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a.norm.weight": first, "a.norm.weight_scale_inv": second}}))
    [problem] = pair_scales(open_checkpoint(tmp_path).entries).problems
    assert problem.message.startswith(f"{tmp_path / first}: a.norm.weight is an FP8 tensor"), \
        problem.message


def test_unquantized_checkpoint_has_no_pairs(tmp_path):
    save_file({"w.weight": torch.ones(4, 4)}, str(tmp_path / "model.safetensors"))
    pairing = pair_scales(open_checkpoint(tmp_path).entries)
    assert not pairing.pairs and not pairing.problems and not pairing.quantized


def test_fixture_checkpoint_pairs(fp8_checkpoints):
    _, fp8_dir = fp8_checkpoints("dsv3")
    ckpt = open_checkpoint(fp8_dir)
    pairing = pair_scales(ckpt.entries, read_quant_config(fp8_dir))
    assert not pairing.problems
    fp8_keys = {k for k, e in ckpt.entries.items() if e.spec.dtype == torch.float8_e4m3fn}
    assert set(pairing.pairs) == fp8_keys and len(fp8_keys) > 20
    assert pairing.pairs["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].scale.spec.shape == (2, 2)
    assert {k for k in ckpt.entries if k.endswith("_scale_inv")} == pairing.companions
