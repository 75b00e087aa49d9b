"""Budgets: the schedule fits, or the error says the smallest budget and why."""

import pytest
import torch

import weightplan
from weightplan import WeightConverter
from weightplan.errors import BudgetError
from weightplan.ops import MergeModulelist

from tests.conftest import Doubler, module_with, moe_model, write_checkpoint


def heavy_checkpoint(tmp_path):
    """Many small plain tensors, then one big group that must be materialized."""
    tensors = {f"a.{i}.w": torch.randn(64, 64) for i in range(24)}
    tensors.update({f"z.big.{e}.w": torch.randn(64, 64) for e in range(16)})
    directory = write_checkpoint(tmp_path / "c", tensors)
    specs = {f"a.{i}.w": ((64, 64), torch.float32) for i in range(24)}
    specs["z.stacked"] = ((16, 64, 64), torch.float32)
    mapping = [WeightConverter(r"z\.big\.*\.w", "z.stacked", [Doubler(), MergeModulelist(0)])]
    return directory, specs, mapping, tensors


def test_budget_moves_the_heavy_group_first(tmp_path):
    directory, specs, mapping, tensors = heavy_checkpoint(tmp_path)
    free = weightplan.explain(module_with(specs), directory, mapping=mapping)
    budget = free.peak_bytes - 64 * 64 * 4 * 8
    plan = weightplan.explain(module_with(specs), directory, mapping=mapping, budget=budget)
    assert plan.peak_bytes <= budget < free.peak_bytes
    assert plan.schedule.steps[0].materialize
    model = module_with(specs)
    report = weightplan.explain(model, directory, mapping=mapping, budget=budget).execute()
    assert report.peak_bytes <= budget
    assert torch.equal(model.z.stacked, torch.stack([2 * tensors[f"z.big.{e}.w"] for e in range(16)]))


def test_impossible_budget_names_the_minimum_and_what_dominates(tmp_path):
    directory, specs, mapping, _ = heavy_checkpoint(tmp_path)
    with pytest.raises(BudgetError) as err:
        weightplan.explain(module_with(specs), directory, mapping=mapping, budget="100KiB")
    message = str(err.value)
    assert "smallest possible peak" in message and "z.stacked" in message
    assert "model tensors" in message and "reads in flight" in message
    plan = weightplan.explain(module_with(specs), directory, mapping=mapping,
                              budget=err.value.minimum_bytes)
    assert plan.peak_bytes == err.value.minimum_bytes


def test_budget_limits_read_ahead(moe_dir):
    directory, ckpt = moe_dir
    model_bytes = sum(t.nbytes for t in ckpt.values())
    free = weightplan.explain(moe_model(), directory, mapping="mixtral")
    tight = weightplan.explain(moe_model(), directory, mapping="mixtral", budget=model_bytes + 600)
    assert tight.peak_bytes <= model_bytes + 600 < free.peak_bytes
    assert tight.schedule.window_bytes < free.schedule.window_bytes
    report = weightplan.explain(moe_model(), directory, mapping="mixtral",
                                budget=model_bytes + 600).execute()
    assert report.peak_bytes <= model_bytes + 600
