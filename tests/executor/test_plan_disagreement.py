"""What the ranks of a save compare before any gather or write (the collectives:
tests/parallel/test_save_agreement.py, test_dp_save.py): each plan's summary, and the
refusal that names the first rank and key that differ from the writer's."""

from __future__ import annotations

import torch

import weightplan
from weightplan.executor.save_agreement import PlanSummary, _disagreement, plan_summary


def model(bias: int = 4) -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    net[0].bias = torch.nn.Parameter(torch.zeros(bias))
    return net


def test_a_plans_summary_is_its_keys_shapes_dtypes_and_gather_order(tmp_path):
    summary = plan_summary(weightplan.explain_save(model(), tmp_path / "a"))
    assert summary.writes == {"0.weight": "F32 [4, 8]", "0.bias": "F32 [4]",
                              "1.weight": "F32 [2, 4]", "1.bias": "F32 [2]"}
    assert summary.reads["0.weight"] == "float32 [4, 8]"
    assert sorted(summary.order) == sorted(summary.writes)
    again = plan_summary(weightplan.explain_save(model(), tmp_path / "b"))
    assert again.digest() == summary.digest()  # (another directory: the same plan)
    other = plan_summary(weightplan.explain_save(model(bias=5), tmp_path / "c"))
    assert other.digest() != summary.digest()


def test_the_refusal_names_each_differing_rank_and_its_first_key():
    writer = PlanSummary({"w": "F32 [4, 8]"}, {"w": "float32 [4, 8]", "v": "float32 [2]"},
                         ("w", "v"))
    sharded = PlanSummary(writer.writes, {**writer.reads,
                                          "w": "float32 [4, 8] DTensor(Shard(dim=0)) on a 2 mesh"},
                          writer.order)
    reordered = PlanSummary(writer.writes, writer.reads, ("v", "w"))
    lacking = PlanSummary({}, writer.reads, writer.order)
    text = _disagreement({0: writer, 1: writer, 2: sharded, 3: reordered, 5: lacking}, 0)
    assert "rank 1" not in text
    assert ("rank 2: reads from the model w as float32 [4, 8] DTensor(Shard(dim=0)) on a 2 "
            "mesh, rank 0 (the writer) as float32 [4, 8]") in text
    assert "rank 3: gathers v where rank 0 (the writer) gathers w (tensor #1)" in text
    assert "rank 5: lacks w (F32 [4, 8]), which rank 0 (the writer) writes" in text
    assert "nothing was written" in text
