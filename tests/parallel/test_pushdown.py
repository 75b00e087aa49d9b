"""Shards pushed down through conversion ops; plan resolution and its problems; rank table."""

import dataclasses
from pathlib import Path

import torch

from tests.conftest import module_with, write_checkpoint
from weightplan import WeightConverter
import weightplan
from weightplan.ops import Chunk, Concatenate, MergeModulelist, PermuteForRope, Transpose
from weightplan.parallel import TensorParallel
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.pipelines.ranks import (
    plan_ranks, read_bytes, whole_reads,
)
from weightplan.planner.inputs.parallel_plan import resolve_sharding
from weightplan.planner.core.sharding.shard_math import slice_local
from weightplan.viz.ranks import rank_table

F32 = torch.float32


def load_ranks(model_specs, tensors, tmp_path, plan, mapping, world=2):
    """Each rank planned and loaded (output="local") into its own fresh meta model."""
    ckpt = write_checkpoint(tmp_path / "ckpt", tensors)
    plans, loaded = [], []
    for rank in range(world):
        model = module_with(model_specs)
        tp = TensorParallel(world_size=world, rank=rank, plan=plan, output="local")
        plans.append(weightplan.explain(model, ckpt, mapping=mapping, tp=tp))
        plans[-1].execute()
        loaded.append({n: p.data for n, p in model.named_parameters()})
    return plans, loaded


def read_regions(plan):
    return sorted((r.entry.key, r.region.starts, r.region.stops)
                  for s in plan.schedule.steps for r in s.reads)


def test_transpose_swaps_the_sharded_dim(tmp_path):
    stored = torch.arange(48, dtype=F32).reshape(8, 6)  # the checkpoint keeps W^T
    model = {"lin.weight": ((6, 8), F32)}
    mapping = [WeightConverter("lin.weight", "lin.weight", operations=[Transpose(0, 1)])]
    ranks, loads = load_ranks(model, {"lin.weight": stored}, tmp_path, {"lin": "colwise"}, mapping)
    assert read_regions(ranks[1]) == [("lin.weight", (0, 3), (8, 6))]  # columns 3..5
    for rank, load in enumerate(loads):
        want = slice_local(stored.T.contiguous(), Placement.shard(0), 2, rank)
        assert torch.equal(load["lin.weight"], want)


def test_chunked_qkv_reads_each_targets_rows(tmp_path):
    fused = torch.arange(48, dtype=F32).reshape(12, 4)
    model = {f"attn.{n}.weight": ((4, 4), F32) for n in "qkv"}
    mapping = [WeightConverter("qkv.weight", ["q.weight", "k.weight", "v.weight"],
                               operations=[Chunk(0)])]
    plan = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise"}
    ranks, loads = load_ranks(model, {"attn.qkv.weight": fused}, tmp_path, plan, mapping)
    starts = sorted(r[1][0] for r in read_regions(ranks[0]))
    assert starts == [0, 4, 8] and read_bytes(ranks[0]) == 6 * 4 * 4
    assert torch.equal(loads[1]["attn.k.weight"], fused[6:8])


def test_packed_gate_up_reads_half_of_each_expert_projection(tmp_path):
    tensors = {f"e.{i}.{w}": torch.randn(6, 4) for i in range(2) for w in ("w1", "w3")}
    model = {"moe.gate_up_proj": ((2, 12, 4), F32)}
    mapping = [WeightConverter(["e.*.w1", "e.*.w3"], "moe.gate_up_proj",
                               operations=[MergeModulelist(0), Concatenate(1)])]
    ranks, loads = load_ranks(model, tensors, tmp_path, {"moe.gate_up_proj": "packed_colwise"},
                              mapping)
    assert {(k, s[0], e[0]) for k, s, e in read_regions(ranks[1])} == {
        (f"e.{i}.{w}", 3, 6) for i in range(2) for w in ("w1", "w3")}
    full = torch.stack([torch.cat([tensors[f"e.{i}.w1"], tensors[f"e.{i}.w3"]]) for i in range(2)])
    for rank, load in enumerate(loads):
        want = slice_local(full, Placement.strided(1, 2), 2, rank)
        assert torch.equal(load["moe.gate_up_proj"], want)
        assert read_bytes(ranks[rank]) == want.numel() * 4


def test_an_op_that_cannot_place_reads_whole_and_says_so(tmp_path):
    stored = torch.randn(8, 4)
    model = {"attn.q.weight": ((8, 4), F32)}
    mapping = [WeightConverter("q.weight", "q.weight", operations=[PermuteForRope(head_dim=4)])]
    ranks, loads = load_ranks(model, {"attn.q.weight": stored}, tmp_path, {"attn.q": "colwise"},
                              mapping)
    assert whole_reads(ranks[0]) == ("attn.q.weight",)
    assert read_bytes(ranks[0]) == stored.numel() * 4
    assert "read whole" in rank_table(tuple(ranks)) and "attn.q.weight" in rank_table(tuple(ranks))
    assert "read whole, then sliced" in str(ranks[0])
    permuted = PermuteForRope(head_dim=4).forward(((stored,),))[0][0]
    assert torch.equal(loads[1]["attn.q.weight"], permuted[4:])


def test_plan_problems_unknown_style_and_entries_matching_nothing():
    model = module_with({"a.weight": ((4, 4), F32), "b.weight": ((4, 4), F32)})
    tp = TensorParallel(world_size=2, rank=0, plan={"a": "colwize", "c.*": "rowwise",
                                                    "b": "rowwise"})
    sharding = resolve_sharding(model, tp, 2)
    keys = {i.key: i.message for i in sharding.issues}
    assert "unknown parallel style 'colwize'" in keys["a"]
    assert "matches no module or parameter" in keys["c.*"]
    assert sharding.placement("b.weight") == Placement.shard(1)
    assert sharding.placement("a.weight") == Placement.plain()


def test_styles_no_1d_placement_expresses_are_refused_by_name():
    """transformers 5.25's ``unit_colwise`` / ``unit_rowwise`` put whole heads on a 2-D
    (heads × replicas) mesh: a plan problem naming the style, and preparing a model for it
    is a ParallelError before transformers is called (no mesh needed to refuse it)."""
    import pytest

    from weightplan.errors import ParallelError
    from weightplan.parallel import prepare_tensor_parallel

    model = module_with({"attn.q.weight": ((8, 4), F32), "attn.o.weight": ((4, 8), F32)})
    plan = {"attn.q": "unit_colwise", "attn.o": "unit_rowwise"}
    issues = {i.key: i.message for i in
              resolve_sharding(model, TensorParallel(world_size=2, rank=0, plan=plan), 2).issues}
    assert "parallel style 'unit_colwise' is not supported" in issues["attn.q"]
    assert "2-D (heads × replicas) mesh" in issues["attn.q"] and "'colwise'" in issues["attn.q"]
    assert "'rowwise' in plan=" in issues["attn.o"]
    with pytest.raises(ParallelError, match=r"plan entry 'attn.q': parallel style 'unit_colwise'"
                       r" is not supported.*\(and 1 more entries\)"):
        prepare_tensor_parallel(model, TensorParallel(plan=plan), mesh=None)


HAND_BUILT = """
import os, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
import weightplan
from weightplan.parallel import TensorParallel, prepare_tensor_parallel
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
mesh = init_device_mesh("cpu", (1,))
with weightplan.init_empty():
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))   # no config, no mesh manager
prepare_tensor_parallel(model, TensorParallel(plan={"0": "colwise", "1": "rowwise"}, mesh=mesh),
                        mesh)
assert isinstance(model[0].weight, DTensor) and model[0].weight.placements == (Shard(0),)
assert model[1].weight.placements == (Shard(1),) and model[1].bias.placements == (Replicate(),)
dist.destroy_process_group()
"""


def test_a_module_built_by_hand_without_a_config_is_prepared():
    """transformers 5.25's ``apply_tensor_parallelism`` reads ``model.config`` and
    ``model._mesh_manager``, which a plain ``nn.Module`` lacks: it is prepared all the same
    (in a process of its own: a 1-rank gloo group)."""
    import os
    import subprocess
    import sys

    from tests.parallel.conftest import free_port

    done = subprocess.run([sys.executable, "-c", HAND_BUILT % free_port()], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_column_sharded_mla_projection_needs_heads_dividing_the_ranks():
    """DeepSeek-V3's ``kv_b_proj`` rows are whole query heads (column-sharded by transformers
    5.25's plan, stated here): 4 heads over 3 ranks would cut one; over 2 they split."""
    import transformers

    from weightplan.bridge.distribute import heads_problem

    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
        qk_nope_head_dim=16, v_head_dim=16, intermediate_size=64, first_k_dense_replace=1)
    with weightplan.init_empty():
        model = transformers.DeepseekV3ForCausalLM(config)
    tp = TensorParallel(plan={"model.layers.*.self_attn.kv_b_proj": "colwise"})
    problem = heads_problem(model, tp, 3)
    assert problem is not None and "num_attention_heads=4 doesn't split over 3 ranks" in problem
    assert "MLA projections" in problem
    assert heads_problem(model, tp, 2) is None


def test_expert_parallel_needs_experts_divisible_by_world():
    model = module_with({"moe.experts.gate_up_proj": ((3, 4, 4), F32)})
    tp = TensorParallel(world_size=2, rank=0, plan={"moe.experts.gate_up_proj": "grouped_gemm"})
    (issue,) = resolve_sharding(model, tp, 2).issues
    assert issue.key == "moe.experts.gate_up_proj" and "3 experts" in issue.message


def test_rank_table_from_one_process(tmp_path):
    tensors = {"emb.weight": torch.randn(10, 4), "norm.weight": torch.randn(4)}
    model = module_with({"emb.weight": ((10, 4), F32), "norm.weight": ((4,), F32)})
    ckpt = write_checkpoint(tmp_path / "ckpt", tensors)
    tp = TensorParallel(world_size=4, rank=0, plan={"emb": "embedding_rowwise"})
    ranks = plan_ranks(model, ckpt, tp, mapping=[])
    assert [read_bytes(r) for r in ranks] == [3 * 16 + 16] * 3 + [16 + 16]
    assert all(r.replicated_bytes == 16 for r in ranks)
    lines = rank_table(ranks).splitlines()
    assert lines[0].startswith("tensor parallel over 4 ranks") and len(lines) == 10
    assert lines[6].startswith("4 ranks: storage 224 B = 1.273× the checkpoint, network 0 B")
    assert lines[7:] == ["replicated (whole on every rank, 16 B):",
                         "  no entry of the plan given names them (1, 16 B):", "    norm.weight"]
    from weightplan import parallel

    assert parallel.rank_table(parallel.plan_ranks(model, ckpt, tp, mapping=[])) == rank_table(ranks)
    # cooperative: norm.weight (the only whole step) is dealt to rank 0 and sent to 3
    shared = plan_ranks(model, ckpt, dataclasses.replace(tp, cooperative=True), mapping=[])
    assert [r.read_bytes for r in shared] == [3 * 16 + 16, 3 * 16, 3 * 16, 16]
    assert [r.exchange.network_bytes for r in shared] == [3 * 16, 16, 16, 16]
    assert "storage 176 B = 1.000× the checkpoint, network 96 B" in rank_table(shared)


def test_dtensor_output_needs_a_mesh_and_sharding_needs_meta(tmp_path):
    import pytest

    from weightplan.errors import ParallelError

    ckpt = write_checkpoint(tmp_path / "ckpt", {"emb.weight": torch.randn(4, 2)})
    tp = TensorParallel(world_size=2, rank=0, plan={"emb": "embedding_rowwise"})
    model = module_with({"emb.weight": ((4, 2), F32)})
    plan = weightplan.explain(model, ckpt, tp=tp)
    assert "tensor parallel: rank 0 of 2" in str(plan) and "dry run" in str(plan)
    with pytest.raises(ParallelError, match="output='local'"):
        plan.execute()
    assert model.emb.weight.is_meta  # nothing was loaded
    allocated = module_with({"emb.weight": ((4, 2), F32)}, device="cpu")
    with pytest.raises(ParallelError, match="emb.weight is already allocated"):
        weightplan.explain(allocated, ckpt, tp=tp)
    with pytest.raises(ParallelError, match="needs a model"):
        weightplan.explain(None, ckpt, tp=tp)
    missing = module_with({"emb.weight": ((4, 2), F32), "head.weight": ((4, 2), F32)})
    tp = TensorParallel(world_size=2, rank=0, plan={"emb": "embedding_rowwise",
                                                    "head": "colwise"}, output="local")
    plan = weightplan.explain(missing, ckpt, tp=tp)  # (a missing tensor: initialized, then
    assert plan.missing == {"head.weight"}             # this rank's part kept, as loaded ones)
    assert not [p for p in plan.problems if p.kind.value == "parallel"]
    report = plan.execute()
    assert set(report.initialized) == {"head.weight"}
    assert missing.head.weight.shape == (2, 2) and missing.emb.weight.shape == (2, 2)


def test_a_tp_plan_is_drawn_and_serialized(tmp_path):
    import json

    tensors = {f"e.{i}.{w}": torch.randn(6, 4) for i in range(2) for w in ("w1", "w3")}
    mapping = [WeightConverter(["e.*.w1", "e.*.w3"], "moe.gate_up_proj",
                               operations=[MergeModulelist(0), Concatenate(1)])]
    ckpt = write_checkpoint(tmp_path / "ckpt", tensors)
    tp = TensorParallel(world_size=2, rank=1, plan={"moe.gate_up_proj": "packed_colwise"},
                        output="local")
    plan = weightplan.explain(module_with({"moe.gate_up_proj": ((2, 12, 4), F32)}), ckpt,
                              mapping=mapping, tp=tp)
    data = json.loads(json.dumps(plan.to_dict()))["tensor_parallel"]
    assert data["rank"] == 1 and data["read_bytes"] == data["held_bytes"] == 2 * 6 * 4 * 4
    assert data["placements"] == {"moe.gate_up_proj": "_StridedShard(dim=1, sf=2)"}
    dot = Path(plan.render(str(tmp_path / "p.dot"))).read_text()
    assert "shard _StridedShard(dim=1, sf=2) · rank 1/2" in dot
