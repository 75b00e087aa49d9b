"""Each rank's local tensors and placements equal transformers' TP / EP load, bit for bit.

The oracle is ``from_pretrained(dir, distributed_config=DistributedConfig(tp_plan="auto"))``
(and ``tp_size=ep_size=N`` for EP) under torchrun with gloo; weightplan plans every rank in
one process (``explain`` with a dry-run rank, ``output="local"``) and executes each plan into a
fresh meta model: the offline pre-sharding path.
"""

import pytest
import torch

from tests.parallel.tp_fixtures import FOUR_RANKS, MOE, configs
import weightplan
from weightplan.parallel import TensorParallel
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.pipelines.ranks import whole_reads

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
    sharded = 0
    for rank in range(world):
        model = meta_model(fixture)
        tp = TensorParallel(world_size=world, rank=rank, experts=mode, output="local")
        plan = weightplan.explain(model, tp_oracle.checkpoints[fixture], tp=tp)
        assert not [p for p in plan.problems if p.kind.value == "parallel"]
        assert not whole_reads(plan)
        report = plan.execute()
        params = dict(model.named_parameters())
        reference = tp_oracle.rank(fixture, mode, world, rank)
        for name, (local, placements) in reference.items():
            assert plan.sharding.plan.placement(name) == oracle_placement(placements), name
            assert params[name].dtype == local.dtype, name
            assert torch.equal(params[name].data, local), name
            sharded += plan.sharding.plan.placement(name).is_sharded
        # every byte read is a byte kept (replicated tensors count as local)
        local_bytes = sum(t.numel() * t.element_size() for t, _ in reference.values())
        assert report.bytes_needed <= 1.02 * local_bytes
    assert sharded > 0


def test_expert_parallel_reads_only_owned_experts(tp_checkpoints):
    tp = TensorParallel(world_size=2, rank=1, experts="ep", output="local")
    plan = weightplan.explain(meta_model("qwen3moe"), tp_checkpoints["qwen3moe"], tp=tp)
    keys = {r.entry.key for s in plan.schedule.steps for r in s.reads}
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in keys
    assert not any(".experts.0." in k or ".experts.1." in k for k in keys)
