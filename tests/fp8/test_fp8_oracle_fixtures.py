"""The kernels against transformers' full dequantize load of our FP8 fixtures.

Every FP8 weight the pairing finds in the checkpoint headers, dequantized by weightplan,
equals what ``from_pretrained(..., FineGrainedFP8Config(dequantize=True))`` puts in the
model (per expert: the expert's slice of the merged parameter) bit for bit wherever
transformers' block derivation is right, and the ceil-block reference everywhere.
"""

import re

import pytest
import torch
from safetensors import safe_open

from tests.fp8.checkpoints import ref_dequant
from tests.fp8.oracle import bits
from weightplan.planner.inputs.checkpoint import open_checkpoint
from weightplan.planner.inputs.fp8_pairs import pair_scales
from weightplan.planner.inputs.quant_config import read_quant_config
from weightplan.planner.core.quant.blocks import dequantize

EXPERT = re.compile(r"^(.*)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")
HALF = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1}


def model_slice(state: dict, key: str) -> torch.Tensor:
    """Where transformers puts checkpoint weight ``key`` in the loaded model."""
    if key in state:
        return state[key]
    layer, expert, name = EXPERT.match(key).groups()
    e = int(expert)
    if name in HALF:
        fused = state[f"{layer}.mlp.experts.gate_up_proj"][e]
        half = fused.shape[0] // 2
        return fused[HALF[name] * half:(HALF[name] + 1) * half]
    return state[f"{layer}.mlp.experts.down_proj"][e]


def transformers_is_right(rows: int, cols: int, scale_shape) -> bool:
    """transformers derives blocks as dim // scale_dim: right iff that is 128, or the
    whole dim is a single block."""
    return all(n % 128 == 0 or g == 1 for n, g in zip((rows, cols), scale_shape[-2:], strict=True))


@pytest.mark.parametrize("name", ["dsv3", "qwen3moe", "mixtral"])
def test_kernel_equals_transformers_dequantize_load(fp8_checkpoints, name):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    _, fp8_dir = fp8_checkpoints(name)
    model = AutoModelForCausalLM.from_pretrained(
        fp8_dir, quantization_config=FineGrainedFP8Config(dequantize=True))
    state = model.state_dict()
    pairing = pair_scales(open_checkpoint(fp8_dir).entries, read_quant_config(fp8_dir))
    assert not pairing.problems and len(pairing.pairs) >= 20
    checked = {"oracle": 0, "reference": 0}
    with safe_open(str(fp8_dir / "model.safetensors"), "pt") as f:
        for key, pair in pairing.pairs.items():
            q, s = f.get_tensor(key), f.get_tensor(pair.scale.key)
            expected = model_slice(state, key)
            got = dequantize(q, s, pair.block, expected.dtype)
            assert torch.equal(bits(got), bits(ref_dequant(q, s, pair.block, expected.dtype))), key
            if transformers_is_right(*q.shape, s.shape):
                assert torch.equal(bits(got), bits(expected.contiguous())), key
                checked["oracle"] += 1
            else:
                checked["reference"] += 1
    assert checked["oracle"] >= 20
    assert checked["reference"] == (2 if name == "dsv3" else 0)  # kv_a_proj_with_mqa ×2
