"""weightplan's FP8 loads against transformers on CPU (recipes: shared reference doc, A).

- dequantize: equals ``from_pretrained(..., FineGrainedFP8Config(dequantize=True))`` for
  every parameter where transformers is right, and the ceil-block reference where it
  isn't (dsv3's 192-row ``kv_a_proj_with_mqa``; dsv3x's 320 rows, which transformers
  refuses to load at all);
- keep: equals transformers' native FP8 load (``validate_environment`` patched);
- quantize: equals transformers' ``Fp8Quantize`` of the bf16 checkpoint.
"""

import pytest
import torch
from safetensors.torch import load_file

import weightplan
from tests.fp8.checkpoints import family, ref_dequant
from tests.fp8.oracle import bits, hf_quantize
from tests.fp8.test_fp8_oracle_fixtures import model_slice


def meta_model(name, fp8=False):
    cls, cfg = family(name)
    with weightplan.init_empty():
        model = cls(cfg)
    if fp8:
        from transformers import FineGrainedFP8Config
        from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear
        replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"],
                                quantization_config=FineGrainedFP8Config())
    return model


def load(model, directory, **kwargs):
    plan = weightplan.explain(model, directory, **kwargs)
    assert not plan.problems and not plan.missing and not plan.unexpected, str(plan)
    plan.execute()
    return plan


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("name", ["dsv3", "qwen3moe", "mixtral"])
def test_dequantize_load_equals_transformers(fp8_checkpoints, name):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    _, fp8_dir = fp8_checkpoints(name)
    model = meta_model(name)
    plan = load(model, fp8_dir, dtype=torch.bfloat16)  # the config's dtype, as "auto" would
    assert "dequantized" in plan.notes[-1].message
    reference = AutoModelForCausalLM.from_pretrained(
        fp8_dir, quantization_config=FineGrainedFP8Config(dequantize=True))
    expected, got = reference.state_dict(), model.state_dict()
    assert set(got) == set(expected)
    wrong_in_transformers = {k for k in expected if "kv_a_proj_with_mqa" in k} if name == "dsv3" else set()
    for key, value in expected.items():  # routers / biases: transformers keeps them fp32
        if key not in wrong_in_transformers:
            assert torch.equal(got[key].double(), value.double()), key
            assert "proj" not in key or same(got[key], value), key
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    for key in wrong_in_transformers:  # 192 rows / 2 scale rows: ceil blocks
        q, s = tensors[key], tensors[key + "_scale_inv"]
        assert same(got[key], ref_dequant(q, s, dtype=got[key].dtype)), key


def test_dequantize_where_transformers_refuses(fp8_checkpoints):
    """dsv3x: kv_a_proj_with_mqa has 320 rows and 3 scale rows (like DeepSeek-V3's 576/5)."""
    _, fp8_dir = fp8_checkpoints("dsv3x")
    model = meta_model("dsv3x")
    load(model, fp8_dir, dtype=torch.float32)
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    state = model.state_dict()
    checked = 0
    for key, q in tensors.items():
        if q.dtype == torch.float8_e4m3fn:
            expected = ref_dequant(q, tensors[key + "_scale_inv"], dtype=torch.float32)
            assert torch.equal(model_slice(state, key), expected), key
            checked += 1
    assert checked == 28 and state["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape[0] == 320


@pytest.mark.parametrize("name", ["dsv3", "mixtral"])
def test_keep_fp8_equals_transformers_native_load(fp8_checkpoints, monkeypatch, name):
    from transformers import AutoModelForCausalLM
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer
    monkeypatch.setattr(FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *a, **k: None)
    _, fp8_dir = fp8_checkpoints(name)
    model = meta_model(name, fp8=True)
    plan = load(model, fp8_dir, dtype=torch.bfloat16)
    assert "0 dequantized" in plan.notes[-1].message
    reference = AutoModelForCausalLM.from_pretrained(fp8_dir).state_dict()
    got = model.state_dict()
    assert set(got) == set(reference)
    assert got["model.layers.1.mlp.experts.gate_up_proj"].dtype == torch.float8_e4m3fn
    assert got["model.layers.1.mlp.experts.gate_up_proj_scale_inv"].shape == (4, 2, 2)
    fp8 = 0
    for key, value in reference.items():  # routers / biases: transformers keeps them fp32
        if value.dtype == torch.float8_e4m3fn or key.endswith("_scale_inv"):
            assert same(got[key], value), key
            fp8 += 1
        else:
            assert torch.equal(got[key].double(), value.double()), key
    assert fp8 >= 24


@pytest.mark.parametrize("name", ["dsv3", "qwen3moe"])
def test_quantize_load_equals_transformers_formula(fp8_checkpoints, name):
    bf16_dir, _ = fp8_checkpoints(name)
    model = meta_model(name, fp8=True)
    plan = load(model, bf16_dir)
    assert "quantized" in plan.notes[-1].message
    state, tensors = model.state_dict(), load_file(str(bf16_dir / "model.safetensors"))
    checked = 0
    for scale_key in (k for k in state if k.endswith(".weight_scale_inv")):
        key = scale_key.removesuffix("_scale_inv")
        value = tensors[key]
        expected = hf_quantize(_padded(value))  # edge tiles: the zero-padded tile
        if expected is not None:
            rows, cols = value.shape
            assert same(state[key], expected[0][:rows, :cols].contiguous()), key
            assert same(state[scale_key], expected[1]), key
        checked += 1
    assert checked == {"dsv3": 16, "qwen3moe": 8}[name]
    gate_up = state["model.layers.1.mlp.experts.gate_up_proj"]
    merged = torch.stack([torch.cat([tensors[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"],
                                     tensors[f"model.layers.1.mlp.experts.{e}.up_proj.weight"]])
                          for e in range(4)])
    expected = hf_quantize(merged)
    if expected is not None:
        assert same(gate_up, expected[0])
        assert same(state["model.layers.1.mlp.experts.gate_up_proj_scale_inv"], expected[1])


def _padded(value: torch.Tensor) -> torch.Tensor:
    rows = -(-value.shape[0] // 128) * 128
    cols = -(-value.shape[1] // 128) * 128
    out = torch.zeros(rows, cols, dtype=value.dtype)
    out[: value.shape[0], : value.shape[1]] = value
    return out
