"""Each rank's local tensors and placements equal transformers' TP / EP load, bit for bit.

The oracle is ``from_pretrained(dir, distributed_config=DistributedConfig(tp_plan="auto"))``
(and ``tp_size=ep_size=N`` for EP) under torchrun with gloo; weightplan plans every rank from
one process (a dry run per rank) and executes each rank's programs with the real executor.
"""

import pytest
import torch

from tests.parallel.tp_fixtures import FOUR_RANKS, MOE, configs
from weightplan.executor.execute_shards import execute_rank
from weightplan.parallel import TensorParallel
from weightplan.planner.tensors.sharding.placements import Placement
from weightplan.planner.tensors.sharding.ranks import plan_ranks

CASES = ([(n, "tp", 2) for n in configs()] + [(n, "ep", 2) for n in MOE]
         + [(n, "tp", 4) for n in FOUR_RANKS])


def meta_model(name):
    cls, cfg = configs()[name]
    with torch.device("meta"):
        return cls(cfg)


def oracle_placement(placements) -> Placement:
    if placements is None:
        return Placement.plain()
    (kind, dim, split_factor), = placements
    if kind == "Replicate":
        return Placement.replicate()
    return Placement.strided(dim, split_factor) if kind == "_StridedShard" else Placement.shard(dim)


@pytest.mark.parametrize("fixture, mode, world", CASES)
def test_every_rank_matches_transformers(tp_oracle, fixture, mode, world):
    model = meta_model(fixture)
    tp = TensorParallel(world_size=world, rank=0, experts=mode, output="local")
    plans = plan_ranks(model, tp_oracle.checkpoints[fixture], tp)
    assert not plans[0].sharding.issues
    sharded = 0
    for plan in plans:
        reference = tp_oracle.rank(fixture, mode, world, plan.rank)
        loaded = execute_rank(plan.programs, plan.checkpoint, threads=2)
        for name, (local, placements) in reference.items():
            if name.startswith("__"):
                continue
            assert plan.sharding.placement(name) == oracle_placement(placements), name
            assert loaded.tensors[name].dtype == local.dtype, name
            assert torch.equal(loaded.tensors[name], local), name
            sharded += plan.sharding.placement(name).is_sharded
        assert loaded.tensors.keys() >= {n for n in reference if not n.startswith("__")}
        # every byte read is a byte kept (replicated tensors count as local)
        assert loaded.bytes_read <= 1.02 * loaded.local_bytes
        assert not plan.whole_reads
    assert sharded > 0


def test_expert_parallel_reads_only_owned_experts(tp_checkpoints):
    model = meta_model("qwen3moe")
    tp = TensorParallel(world_size=2, rank=1, experts="ep")
    (plan,) = plan_ranks(model, tp_checkpoints["qwen3moe"], tp, ranks=range(1, 2))
    keys = {r.entry.key for p in plan.programs for r in p.program.reads}
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in keys
    assert not any(".experts.0." in k or ".experts.1." in k for k in keys)
