"""gpt-oss in MXFP4 (``*_blocks`` / ``*_scales`` of fused experts), written by our encoder
from a tiny transformers GptOss model, loaded into a floating GptOss: each expert tensor
equal to transformers' own MXFP4 dequantizer (``convert_moe_packed_tensors``: transposed
to (E, in, out), gate/up interleaved as stored), the rest as saved."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightplan
from tests.fp8.test_fp8_interop import same
from tests.quant.makers import mxfp4_encode

T = pytest.importorskip("transformers")


def gptoss_config():
    return T.GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=4,
                          num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=128,
                          layer_types=["sliding_attention", "full_attention"])


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    """``(mxfp4 dir, {key: expected tensor})``."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    root = tmp_path_factory.mktemp("gptoss")
    torch.manual_seed(0)
    T.GptOssForCausalLM(gptoss_config()).to(torch.bfloat16).save_pretrained(root / "bf16")
    tensors = load_file(str(root / "bf16" / "model.safetensors"))
    out, expected = {}, {}
    for key, t in tensors.items():
        if key.endswith(("gate_up_proj", "down_proj")):
            blocks, scales = mxfp4_encode(t.transpose(1, 2))  # rows: the output dim
            out[key + "_blocks"], out[key + "_scales"] = blocks, scales
            expected[key] = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
        else:
            out[key] = expected[key] = t
    qdir = root / "mxfp4"
    qdir.mkdir()
    save_file(out, str(qdir / "model.safetensors"))
    config = json.loads((root / "bf16" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    (qdir / "config.json").write_text(json.dumps(config))
    return qdir, expected


def test_gptoss_mxfp4_equals_transformers_dequantizer(gptoss):
    qdir, expected = gptoss
    with weightplan.init_empty():
        model = T.GptOssForCausalLM(gptoss_config())
    plan = weightplan.explain(model, qdir, dtype=torch.bfloat16)
    assert not plan.problems and not plan.missing and not plan.unexpected, str(plan)
    assert str(plan).count("MXFP4 (E2M1, 32 per E8M0 scale): 4 tensors") == 1, str(plan)
    plan.execute()
    params = dict(model.named_parameters())
    for key, want in expected.items():
        assert same(params[key].detach(), want), key
    gate_up = params["model.layers.0.mlp.experts.gate_up_proj"]
    assert tuple(gate_up.shape) == (4, 64, 192)  # (E, in, out): gate = even, up = odd columns


@pytest.mark.parametrize("experts", [(0, 4), (1, 3)])
def test_a_fused_stack_holds_one_experts_window_at_a_time(experts):
    from weightplan.planner.core.geometry import Region
    from weightplan.planner.core.quant.formats import Scheme
    from weightplan.planner.tensors.lower.packed_reads import packed_read_layout

    scheme = Scheme("mxfp4", transpose=True)
    parts = (((4, 192, 2, 16), 1), ((4, 192, 2), 1))  # gate_up_proj: (E, in 64, out 192)
    region = Region((experts[0], 0, 0), (experts[1], 64, 192))
    read = packed_read_layout(scheme, (4, 64, 192), region, parts, True)
    assert read.by_lead == (True, True)
    assert read.held == 192 * 2 * 16 + 192 * 2  # one expert's blocks and scales
    assert sum(p.asked for p in read.parts) == (experts[1] - experts[0]) * read.held
    flat = packed_read_layout(scheme, (64, 192), Region((0, 0), (64, 192)),
                              (((192, 2, 16), 1), ((192, 2), 1)), True)
    assert flat.by_lead == (False, False) and flat.held == 192 * 2 * 16 + 192 * 2


def test_gptoss_estimate_matches_what_the_executor_holds(gptoss):
    qdir, _ = gptoss  # (one reader: with several, what overlaps depends on the timing)
    with weightplan.init_empty():
        model = T.GptOssForCausalLM(gptoss_config())
    plan = weightplan.explain(model, qdir, dtype=torch.bfloat16, threads=0)
    report = plan.execute()
    assert report.peak_bytes <= plan.peak_bytes <= 1.05 * report.peak_bytes


def test_a_plain_tensor_beside_one_layers_blocks_is_refused_alone(gptoss, tmp_path):
    """One layer's ``down_proj`` also stored plain beside its ``down_proj_blocks``: that
    weight refused at plan time, naming both keys (neither picked); the other layer's
    paired as before."""
    qdir, expected = gptoss
    key = "model.layers.0.mlp.experts.down_proj"
    tensors = load_file(str(qdir / "model.safetensors")) | {key: expected[key]}
    both = tmp_path / "both"
    both.mkdir()
    save_file(tensors, str(both / "model.safetensors"))
    (both / "config.json").write_text((qdir / "config.json").read_text())
    with torch.device("meta"):
        model = T.GptOssForCausalLM(gptoss_config()).to(torch.bfloat16)
    plan = weightplan.explain(model, both)
    problems = [p for p in plan.problems if p.kind.value == "quantization"]
    assert [p.key for p in problems] == [key], str(plan)
    assert f"{key}_blocks is the packed weight {key}" in problems[0].message
    assert f"holds {key} as a plain tensor too" in problems[0].message
