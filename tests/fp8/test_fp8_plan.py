"""FP8 plans: problems reported by explain and refused by execute, what the plan shows,
and its memory model (fp8 bytes, scales, chunk workspaces) against what the executor held."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightplan
from tests.conftest import module_with
from tests.fp8.test_fp8_interop import meta_model
from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.quantize import quantize


def rewritten(src, dst, change):
    dst.mkdir()
    tensors = load_file(str(src / "model.safetensors"))
    save_file(change(dict(tensors)), str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_missing_scale_is_reported_and_refused(fp8_checkpoints, tmp_path):
    _, fp8_dir = fp8_checkpoints("mixtral")
    key = "model.layers.0.self_attn.q_proj.weight"

    def drop(t):
        del t[key + "_scale_inv"]
        return t

    model = meta_model("mixtral")
    plan = weightplan.explain(model, rewritten(fp8_dir, tmp_path / "c", drop))
    [problem] = [p for p in plan.problems if p.kind.value == "quantization"]
    assert problem.key == key and "missing scale" in problem.message
    assert "quantization" in str(plan) and key in str(plan)
    assert any(p["kind"] == "quantization" for p in plan.to_dict()["problems"])
    with pytest.raises(QuantizationError, match="nothing was loaded"):
        plan.execute()
    assert next(model.parameters()).is_meta  # refused before any byte was written


def test_an_expert_missing_its_scale_in_a_merge_names_the_scale(fp8_checkpoints, tmp_path):
    """One expert's scale gone from a stack its siblings dequantize into: a typed error
    naming the file, the expert's weight and the scale it lacks (was an OpError about
    stacking f8_e4m3 with bf16)."""
    _, fp8_dir = fp8_checkpoints("dsv3")
    key = "model.layers.1.mlp.experts.1.up_proj.weight"

    def drop(t):
        del t[key + "_scale_inv"]
        return t

    directory = rewritten(fp8_dir, tmp_path / "c", drop)
    with pytest.raises(QuantizationError) as info:
        weightplan.explain(meta_model("dsv3"), directory, dtype=torch.bfloat16)
    text = str(info.value)
    assert str(directory / "model.safetensors") in text and key + "_scale_inv" in text, text


def test_scale_grid_that_does_not_fit_is_refused(fp8_checkpoints, tmp_path):
    _, fp8_dir = fp8_checkpoints("dsv3")
    key = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"

    def squash(t):  # 192 rows with one scale row: what a floor grid would give
        t[key + "_scale_inv"] = t[key + "_scale_inv"][:1].contiguous()
        return t

    plan = weightplan.explain(meta_model("dsv3"), rewritten(fp8_dir, tmp_path / "c", squash))
    [problem] = [p for p in plan.problems if p.kind.value == "quantization"]
    assert "[1, 2]" in problem.message and "[192, 256]" in problem.message
    assert "[2, 2]" in problem.message
    with pytest.raises(QuantizationError):
        plan.execute()


def test_fp8_parameter_without_scale_parameter_is_refused(tmp_path):
    save_file({"a.weight": torch.randn(128, 128)}, str(tmp_path / "model.safetensors"))
    model = module_with({"a.weight": ((128, 128), torch.float8_e4m3fn)})
    plan = weightplan.explain(model, tmp_path)
    assert [p.key for p in plan.problems if p.kind.value == "quantization"] == ["a.weight"]
    with pytest.raises(QuantizationError):
        plan.execute()


def test_plain_float8_data_is_a_copy(tmp_path):
    data = torch.randn(4, 4).to(torch.float8_e4m3fn)
    save_file({"a.weight": data}, str(tmp_path / "model.safetensors"))
    model = module_with({"a.weight": ((4, 4), torch.float8_e4m3fn)})
    plan = weightplan.explain(model, tmp_path)
    assert not plan.problems
    plan.execute()
    assert torch.equal(model.a.weight.view(torch.uint8), data.view(torch.uint8))


def test_plan_shows_fp8_nodes(fp8_checkpoints, tmp_path):
    _, fp8_dir = fp8_checkpoints("mixtral")
    plan = weightplan.explain(meta_model("mixtral"), fp8_dir, dtype=torch.bfloat16)
    text = str(plan)
    assert "dequantize 128×128 → bf16 (per source, with its scale) → MergeModulelist" in text
    assert "32 dequantized, 0 kept in FP8, 0 quantized" in text
    rows = json.loads(json.dumps(plan.to_dict()))["rows"]
    assert any("dequantize 128×128" in r["ops"] for r in rows)
    dot = plan.render(str(tmp_path / "plan.dot"))
    drawn = open(dot).read()
    assert "dequantize 128×128 → bf16" in drawn and "weight_scale_inv" in drawn
    assert len(plan.timeline()) == 2 * len(plan.schedule.steps)


def test_quantize_shows_in_plan(fp8_checkpoints):
    bf16_dir, _ = fp8_checkpoints("mixtral")
    plan = weightplan.explain(meta_model("mixtral", fp8=True), bf16_dir)
    assert "quantize 128×128 → f8_e4m3 + scale" in str(plan)
    assert "12 quantized" in str(plan)


def big_fp8_checkpoint(directory, experts=8, rows=1024, cols=768):
    tensors = {}
    g = torch.Generator().manual_seed(0)
    for e in range(experts):
        for w in ("w1", "w3", "w2"):
            shape = (rows, cols) if w != "w2" else (cols, rows)
            key = f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"
            tensors[key], tensors[key + "_scale_inv"] = quantize(torch.randn(shape, generator=g))
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def moe_target(experts=8, rows=1024, cols=768, dtype=torch.bfloat16):
    return module_with({"model.layers.0.mlp.experts.gate_up_proj": ((experts, 2 * rows, cols), dtype),
                        "model.layers.0.mlp.experts.down_proj": ((experts, cols, rows), dtype)})


@pytest.mark.parametrize("threads", [0, 2])
def test_memory_estimate_matches_what_the_executor_holds(tmp_path, threads):
    ckpt = big_fp8_checkpoint(tmp_path / "c")
    model = moe_target()
    plan = weightplan.explain(model, ckpt, mapping="mixtral", threads=threads)
    assert not plan.problems, str(plan)
    model_bytes = sum(p.numel() * 2 for p in model.parameters())
    report = plan.execute()
    assert report.peak_bytes <= plan.peak_bytes <= 1.05 * report.peak_bytes
    # above the model: per reader, one expert's FP8 window, its scales, an fp32 chunk and
    # its int32 table indices
    per_task = 1024 * 768 * (1 + 8) + 8 * 6 * 4
    assert plan.peak_bytes - model_bytes <= max(threads, 1) * per_task
    budget = model_bytes + max(threads, 1) * per_task
    budgeted = weightplan.explain(moe_target(), ckpt, mapping="mixtral", threads=threads,
                                  budget=budget)
    assert budgeted.peak_bytes <= budget
    assert budgeted.execute().peak_bytes <= budget


def test_command_line_explains_a_deepseek_fp8_checkpoint(fp8_checkpoints, capsys):
    """What a new user runs first: every F8_E4M3 weight is kept with its scale (the model
    built with its FP8 layers, as served); with --dequantize, every one is dequantized with
    its scale, no scale key is left over as unexpected."""
    from weightplan.cli import main
    _, fp8_dir = fp8_checkpoints("dsv3")
    assert main(["explain", str(fp8_dir)]) == 0
    out = capsys.readouterr().out
    assert "0 dequantized, 18 kept in FP8, 0 quantized" in out and "problems: none" in out
    assert main(["explain", str(fp8_dir), "--dequantize"]) == 0
    out = capsys.readouterr().out
    assert "28 dequantized, 0 kept in FP8, 0 quantized" in out
    assert "problems: none" in out and "weight_scale_inv" not in out.split("notes:")[0]
