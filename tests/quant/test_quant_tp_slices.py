"""Packed checkpoints under tensor and expert parallel read only each rank's bytes.

Each rank (planned for a world of 2 or 4, executed with ``output="local"``) dequantizes
exactly weightplan's own single-process load split as DTensor splits it, and reads at
most 1.05× what it needs: its share of every quantized weight's stored bytes (packed
codes, the scale tiles and zero points over them), proportional to the logical elements
it holds, plus every plain tensor's share. A rank of an expert-parallel load reads only
its own experts. A world whose slices cut a quantization group along ``in`` is a problem
naming the stored weight, the group size and the boundary.
"""

import math

import pytest
import torch
from safetensors import safe_open

import weightplan
from tests.fp8.test_fp8_interop import meta_model
from tests.fp8.test_fp8_tp import check_rank
from tests.parallel.plans import experts_split_plan
from tests.quant.checkpoints import quantized_checkpoint
from weightplan.errors import QuantizationError
from weightplan.parallel import TensorParallel
from weightplan.planner.core.sharding.shard_math import slice_local
from weightplan.planner.tensors.verify.verify import verify

pytest.importorskip("compressed_tensors")

WIDE = "qwen3moe-wide"  # rows of 512-1024 columns: a column slice's rows are read by runs
KINDS = ["int", "int-asym", "nvfp4", "modelopt", "fp8-channel", "fp8-block"]
_FULL: dict = {}


def _headers(directory) -> dict[str, tuple[int, int]]:
    """``key → (stored bytes, elements)`` of a checkpoint, from its header."""
    out = {}
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        for key in f.keys():  # noqa: SIM118  (safe_open is no mapping)
            s = f.get_slice(key)
            out[key] = (math.prod(s.get_shape()) * _itemsize(s.get_dtype()), math.prod(s.get_shape()))
    return out


def _itemsize(name: str) -> int:
    return {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "U8": 1, "F8_E4M3": 1}[name]


def stored_per_element(qdir, odir) -> float:
    """Stored bytes per logical element of the quantized weights (codes, scales, zeros)."""
    q, o = _headers(qdir), _headers(odir)
    plain = plain_keys(qdir, odir)
    elements = sum(n for k, (_, n) in o.items() if k not in plain)
    return sum(b for k, (b, _) in q.items() if k not in plain) / elements


def plain_keys(qdir, odir) -> set[str]:
    """The keys stored as they are (the same bytes and elements in both checkpoints)."""
    q, o = _headers(qdir), _headers(odir)
    return {k for k in q if o.get(k) == q[k]}


def full_load(tmp_path, kind):
    if kind not in _FULL:
        qdir, odir = quantized_checkpoint(tmp_path, kind, name=WIDE)
        model = meta_model(WIDE)
        weightplan.load(model, qdir, dtype=torch.bfloat16)
        _FULL[kind] = qdir, odir, {n: p.data for n, p in model.named_parameters()}
    return _FULL[kind]


def needed(plan, full, per_element: float, plain: set[str], world: int, rank: int) -> float:
    """The rank's share of the stored bytes of what it holds (every parameter)."""
    total = 0.0
    for name, tensor in full.items():
        placement = plan.sharding.plan.placement(name).normalized(tensor.dim())
        local = slice_local(tensor, placement, world, rank).numel()
        total += local * (2 if name in plain else per_element)
    return total


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_reads_its_slice_and_decodes_it_exactly(tmp_path_factory, kind, world):
    qdir, odir, full = full_load(tmp_path_factory.getbasetemp(), kind)
    per_element = stored_per_element(qdir, odir)
    plain = plain_keys(qdir, odir)
    for rank in range(world):
        model = meta_model(WIDE)  # its experts split over the ranks too
        tp = TensorParallel(world_size=world, rank=rank, plan=experts_split_plan(model),
                            output="local")
        plan = weightplan.explain(model, qdir, dtype=torch.bfloat16, tp=tp)
        assert not plan.problems, str(plan)
        verify(plan.graph, plan.schedule.steps)
        report = plan.execute()
        check_rank(model, plan, full, world, rank)
        want = needed(plan, full, per_element, plain, world, rank)
        assert report.bytes_read <= 1.05 * want, (rank, report.bytes_read, want)
        assert report.bytes_read == report.bytes_needed


@pytest.mark.parametrize("kind", ["int", "nvfp4"])
def test_expert_parallel_ranks_read_only_their_experts(tmp_path_factory, kind):
    qdir, _, full = full_load(tmp_path_factory.getbasetemp(), kind)
    for rank in range(2):
        model = meta_model(WIDE)
        tp = TensorParallel(world_size=2, rank=rank, experts="ep", output="local")
        plan = weightplan.explain(model, qdir, dtype=torch.bfloat16, tp=tp)
        assert not plan.problems, str(plan)
        plan.execute()
        check_rank(model, plan, full, 2, rank)
        experts = {int(r.entry.key.split(".experts.")[1].split(".")[0])
                   for s in plan.schedule.steps for r in s.reads if ".experts." in r.entry.key}
        assert experts == {2 * rank, 2 * rank + 1}


@pytest.mark.parametrize("kind, group", [("int", 32), ("nvfp4", 16)])
def test_a_boundary_inside_a_group_is_a_problem(tmp_path_factory, kind, group):
    qdir, _, _ = full_load(tmp_path_factory.getbasetemp(), kind)
    model = meta_model(WIDE)  # 3 ranks: down_proj's 1024 columns are 342 + 341 + 341
    experts = experts_split_plan(model)  # each expert split over the ranks, on any version
    tp = TensorParallel(world_size=3, rank=1, plan=experts, output="local")
    plan = weightplan.explain(model, qdir, dtype=torch.bfloat16, tp=tp)
    split = [p for p in plan.problems if "inside a group" in p.message]
    key = "model.layers.0.mlp.experts.0.down_proj.weight_packed"
    found = next(p for p in split if p.key == key)
    assert f"group of {group}" in found.message and "in = 342" in found.message
    assert "rank 1 of 3" in found.message
    with pytest.raises(QuantizationError):
        plan.execute()
    # the same world over a checkpoint whose groups it keeps whole: no such problem
    tp = TensorParallel(world_size=2, rank=1, plan=experts, output="local")
    assert not weightplan.explain(meta_model(WIDE), qdir, dtype=torch.bfloat16, tp=tp).problems


def test_explain_tp_shows_each_rank_and_the_group_split(tmp_path_factory, capsys):
    from weightplan.cli import main

    qdir, _, _ = full_load(tmp_path_factory.getbasetemp(), "int")
    assert main(["explain", str(qdir), "--tp", "2", "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["storage_bytes"] == rows[0]["storage_bytes"] for r in rows)
    assert main(["explain", str(qdir), "--tp", "3"]) == 1
    out = capsys.readouterr().out
    assert "inside a group of 32" in out and "in = 342" in out


def gptoss_checkpoint(root):
    """gpt-oss with MXFP4 fused experts (``[E, out, in/32, 16]``, gate/up interleaved)
    whose 128-wide ``in`` splits into whole 32-blocks over 2 and 4 ranks."""
    import json

    import transformers as T
    from safetensors.torch import load_file, save_file

    from tests.quant.makers import mxfp4_encode

    config = T.GptOssConfig(hidden_size=128, intermediate_size=128, num_local_experts=4,
                            num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32, vocab_size=128,
                            layer_types=["full_attention"])
    torch.manual_seed(0)
    T.GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(root / "bf16")
    out = {}
    for key, t in load_file(str(root / "bf16" / "model.safetensors")).items():
        if key.endswith(("gate_up_proj", "down_proj")):
            out[key + "_blocks"], out[key + "_scales"] = mxfp4_encode(t.transpose(1, 2))
        else:
            out[key] = t
    (root / "mxfp4").mkdir()
    save_file(out, str(root / "mxfp4" / "model.safetensors"))
    data = json.loads((root / "bf16" / "config.json").read_text())
    data["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (root / "mxfp4" / "config.json").write_text(json.dumps(data))
    return root / "mxfp4", config


@pytest.mark.parametrize("world, experts", [(2, "tp"), (4, "tp"), (2, "ep")])
def test_gptoss_mxfp4_ranks_equal_the_split_full_load(tmp_path, world, experts):
    import transformers as T

    qdir, config = gptoss_checkpoint(tmp_path)
    with weightplan.init_empty():
        model = T.GptOssForCausalLM(config)
    weightplan.load(model, qdir, dtype=torch.bfloat16)
    full = {n: p.data for n, p in model.named_parameters()}
    for rank in range(world):
        with weightplan.init_empty():
            local = T.GptOssForCausalLM(config)
        tp = TensorParallel(world_size=world, rank=rank, experts=experts, output="local")
        plan = weightplan.explain(local, qdir, dtype=torch.bfloat16, tp=tp)
        assert not plan.problems, str(plan)
        verify(plan.graph, plan.schedule.steps)
        report = plan.execute()
        check_rank(local, plan, full, world, rank)
        assert report.bytes_read == report.bytes_needed
