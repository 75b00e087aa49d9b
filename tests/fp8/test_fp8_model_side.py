"""The model side: FP8 parameters with their scale parameters (transformers' FP8Linear /
FP8Experts), the per-weight decision, and ops carried over to scale grids."""

import pytest
import torch

from tests.conftest import module_with
from tests.fp8.checkpoints import family
from weightplan.errors import QuantizationError
from weightplan.planner.inputs.fp8_model import Fp8Action, decide, expected_scale, fp8_params
from weightplan.planner.inputs.model_info import inspect_model
from weightplan.planner.inputs.quant_config import QuantConfig, parse_quant_config
from weightplan.planner.core.quant.scale_ops import scale_op
from weightplan.planner.core.ops.joins import Chunk, Concatenate, MergeModulelist
from weightplan.planner.core.ops.reshape import PermuteForRope, Transpose
from weightplan.planner.core.spec import TensorSpec

F8, F32, BF16 = torch.float8_e4m3fn, torch.float32, torch.bfloat16


def fp8_model(name):
    """A tiny transformers model on meta with its linears and experts swapped for FP8
    ones, as a native FP8 ``from_pretrained`` builds it."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear
    cls, cfg = family(name)
    with torch.device("meta"):
        model = cls(cfg)
    qc = FineGrainedFP8Config()
    replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=qc)
    return model, qc


@pytest.mark.parametrize("name", ["qwen3moe", "dsv3"])
def test_finds_transformers_fp8_parameters(name):
    model, qc = fp8_model(name)
    found = fp8_params(inspect_model(model), parse_quant_config(qc))
    assert not found.unscaled
    gate_up = found.params["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate_up.scale == "model.layers.1.mlp.experts.gate_up_proj_scale_inv"
    state = model.state_dict()
    assert tuple(state[gate_up.scale].shape) == (4, 2, 2)
    if name == "dsv3":
        kv = found.params["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
        assert tuple(state[kv.scale].shape) == (2, 2)
    assert "lm_head.weight" not in found.params
    assert found.companions == {p.scale for p in found.params.values()}


def test_unscaled_fp8_parameters_are_named():
    model = module_with({"a.weight": ((128, 128), F8), "a.weight_scale_inv": ((1, 1), F32),
                         "b.weight": ((128, 128), F8),
                         "c.weight": ((256, 128), F8), "c.weight_scale_inv": ((1, 1), F32),
                         "d.weight": ((4, 4), BF16)})
    found = fp8_params(inspect_model(model), QuantConfig())
    assert set(found.params) == {"a.weight"} and set(found.unscaled) == {"b.weight", "c.weight"}


@pytest.mark.parametrize("source, target, src_scaled, dst_scaled, action", [
    (F8, BF16, True, False, Fp8Action.DEQUANTIZE),
    (F8, F32, True, False, Fp8Action.DEQUANTIZE),
    (F8, F8, True, True, Fp8Action.KEEP),
    (BF16, F8, False, True, Fp8Action.QUANTIZE),
    (BF16, BF16, False, False, Fp8Action.NONE),
    (F8, BF16, False, False, Fp8Action.REFUSE),  # missing scale: never a silent cast
    (BF16, F8, False, False, Fp8Action.REFUSE),  # FP8 parameter without a scale parameter
    (F8, F8, False, False, Fp8Action.NONE),  # plain float8 copy
    (F8, None, True, False, Fp8Action.DEQUANTIZE),
])
def test_decides_per_weight(source, target, src_scaled, dst_scaled, action):
    got = decide(TensorSpec((256, 256), source), None if target is None else TensorSpec((256, 256), target),
                 source_scaled=src_scaled, target_scaled=dst_scaled)
    assert got is action


def test_expected_scale():
    assert expected_scale(TensorSpec((4, 320, 200), F8), (128, 128)) == TensorSpec((4, 3, 2), F32)


def test_expert_merge_carries_over_to_scales():
    experts = (TensorSpec((128, 256), F8),) * 4
    merge = MergeModulelist(0)
    assert scale_op(merge, experts, (128, 128)) is merge
    fused = Concatenate(1, sizes=(128, 128))
    assert scale_op(fused, (TensorSpec((4, 128, 256), F8),) * 2, (128, 128)) == Concatenate(1, sizes=(1, 1))
    assert scale_op(Transpose(1, 2), experts, (128, 128)) == Transpose(1, 2)
    split = Chunk(0, sizes=(256, 128, 128))
    assert scale_op(split, (TensorSpec((512, 256), F8),), (128, 128)) == Chunk(0, sizes=(2, 1, 1))
    last_partial = Chunk(0, sizes=(256, 64))
    assert scale_op(last_partial, (TensorSpec((320, 256), F8),), (128, 128)).sizes == (2, 1)


@pytest.mark.parametrize("op, specs", [
    (Concatenate(1, sizes=(192, 192)), (TensorSpec((4, 192, 256), F8),) * 2),
    (Chunk(0, sizes=(64, 64)), (TensorSpec((128, 256), F8),)),
    (PermuteForRope(head_dim=64), (TensorSpec((256, 256), F8),)),
])
def test_ops_that_cut_blocks_refuse_to_keep_fp8(op, specs):
    with pytest.raises(QuantizationError, match="dequantize instead") as info:
        scale_op(op, specs, (128, 128), key="layers.0.mlp.experts.gate_up_proj")
    assert "layers.0.mlp.experts.gate_up_proj" in str(info.value)
