"""Plans: findings before any byte is read, tied tensors, dtypes, placement, schedule."""

import json

import networkx as nx
import pytest
import torch
from torch import nn

import weightplan
from weightplan import WeightConverter
from weightplan.errors import BudgetError, OpError, PlanError
from weightplan.ops import Chunk, Transpose
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.tensors.ir.graph import PlanGraph
from weightplan.planner.tensors.verify.verify import verify

from tests.conftest import module_with, moe_checkpoint, moe_model


def test_explain_reads_no_tensor_bytes(moe_dir, monkeypatch):
    directory, _ = moe_dir
    import weightplan.executor.reader as reader
    monkeypatch.setattr(reader.Reader, "window", lambda *a: pytest.fail("read at plan time"))
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    assert not plan.missing and not plan.unexpected and not plan.mismatched


def test_missing_unexpected_and_mismatched_are_found_not_raised():
    model = module_with({"a.weight": ((2, 3), torch.float32), "b.weight": ((4,), torch.float32),
                         "c.weight": ((5,), torch.float32)})
    ckpt = {"a.weight": torch.ones(3, 2), "b.weight": torch.ones(4), "zzz": torch.ones(1)}
    plan = weightplan.explain(model, ckpt)
    assert plan.missing == {"c.weight"}
    assert plan.unexpected == {"zzz"}
    assert plan.mismatched == {"a.weight": ((3, 2), (2, 3))}
    assert plan.mismatched["a.weight"].model_shape == (2, 3)
    text = str(plan)
    assert "missing (1): c.weight" in text and "unexpected (1): zzz" in text
    assert "checkpoint gives [3, 2] but the model has [2, 3]" in text


def test_mismatch_message_names_keys_and_op_chain():
    model = module_with({"x.proj": ((4, 5), torch.float32)})
    conv = WeightConverter("x.fc", "x.proj", [Transpose(0, 1)])
    plan = weightplan.explain(model, {"x.fc": torch.ones(4, 5)}, mapping=[conv])
    (problem,) = [p for p in plan.problems if p.kind.value == "mismatch"]
    assert "x.fc" in problem.message and "Transpose(dim0=0, dim1=1)" in problem.message


def test_converter_output_without_model_tensor_makes_sources_unexpected():
    model = module_with({"other": ((1,), torch.float32)})
    plan = weightplan.explain(model, {"x.fc": torch.ones(2, 2)},
                              mapping=[WeightConverter("x.fc", "x.proj", [Transpose()])])
    assert plan.unexpected == {"x.fc"} and plan.missing == {"other"}


def test_tied_parameters_load_once():
    emb = nn.Embedding(8, 4, device="meta")
    model = nn.Module()
    model.embed = emb
    model.head = nn.Linear(4, 8, bias=False, device="meta")
    model.head.weight = emb.weight
    ckpt = {"embed.weight": torch.randn(8, 4), "head.weight": torch.randn(8, 4)}
    plan = weightplan.explain(model, ckpt)
    assert not plan.missing and not plan.unexpected
    assignments = [n for n in plan.graph if n.kind is NodeKind.SINK]
    assert len(assignments) == 1 and assignments[0].attrs.target == "embed.weight"
    plan.execute()
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.embed.weight, ckpt["embed.weight"])


def test_tied_parameter_from_its_alias_only():
    model = nn.Module()
    model.embed = nn.Embedding(8, 4, device="meta")
    model.head = nn.Linear(4, 8, bias=False, device="meta")
    model.head.weight = model.embed.weight
    ckpt = {"head.weight": torch.randn(8, 4)}
    plan = weightplan.explain(model, ckpt)
    assert not plan.missing
    plan.execute()
    assert torch.equal(model.embed.weight, ckpt["head.weight"])


def test_dtype_casts_floats_only_and_shows_it():
    model = module_with({"w": ((2,), torch.float32), "i": ((2,), torch.int64)}, buffers=("i",))
    ckpt = {"w": torch.ones(2, dtype=torch.float32), "i": torch.arange(2)}
    plan = weightplan.explain(model, ckpt, dtype="bf16")
    assert "f32→bf16" in str(plan)
    plan.execute()
    assert model.w.dtype == torch.bfloat16 and model.i.dtype == torch.int64


def test_meta_model_keeps_its_dtype_by_default():
    model = module_with({"w": ((3,), torch.float32)})
    plan = weightplan.explain(model, {"w": torch.ones(3, dtype=torch.bfloat16)})
    casts = [n for n in plan.graph if n.kind is NodeKind.CAST]
    assert len(casts) == 1 and casts[0].attrs.dtype == torch.float32


def test_fused_experts_are_read_straight_into_the_parameter(moe_dir):
    directory, _ = moe_dir
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    assert all(r.direct for p in plan.schedule.steps for r in p.reads)
    assert all(not p.materialize for p in plan.schedule.steps)
    assert "100% straight into model memory" in str(plan)


def largest_windows(ckpt, threads=4):
    return sum(sorted((t.nbytes for t in ckpt.values()), reverse=True)[:threads])


def test_peak_estimate_is_the_model_plus_read_windows(moe_dir):
    directory, ckpt = moe_dir
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    model_bytes = sum(t.nbytes for t in ckpt.values())
    assert plan.model_bytes == model_bytes
    assert model_bytes < plan.peak_bytes <= model_bytes + largest_windows(ckpt)


def test_allocated_model_costs_only_read_windows(moe_dir):
    directory, ckpt = moe_dir
    plan = weightplan.explain(moe_model(device="cpu"), directory, mapping="mixtral")
    assert 0 < plan.peak_bytes <= largest_windows(ckpt)


def test_in_memory_sources_cost_nothing_extra():
    ckpt = moe_checkpoint()
    plan = weightplan.explain(moe_model(), ckpt, mapping="mixtral")
    assert plan.peak_bytes == plan.model_bytes


def test_chunk_that_cannot_split_raises_at_plan_time():
    model = module_with({"q": ((3, 2), torch.float32), "k": ((3, 2), torch.float32)})
    conv = WeightConverter("qk", ["q", "k"], [Chunk(0)])
    with pytest.raises(OpError, match="can't split"):
        weightplan.explain(model, {"qk": torch.ones(5, 2)}, mapping=[conv])


def test_graph_is_verified_and_networkx():
    plan = weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral")
    assert isinstance(plan.graph, PlanGraph)
    assert nx.is_directed_acyclic_graph(plan.graph.to_networkx())
    verify(plan.graph, plan.schedule.steps, plan.checkpoint)
    kinds = {n.kind for n in plan.graph}
    assert kinds == {NodeKind.READ, NodeKind.OP, NodeKind.SINK}
    assert all(n.spec is not None for n in plan.graph)


def test_verify_catches_two_producers():
    plan = weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral")
    assign = next(n for n in plan.graph
                  if n.kind is NodeKind.SINK and n.inputs[0].kind is NodeKind.OP)
    read = next(n for n in plan.graph if n.kind is NodeKind.READ)
    from dataclasses import replace
    twin = replace(assign, inputs=(read,))
    with pytest.raises(PlanError, match="also comes from"):
        verify(PlanGraph(plan.graph.nodes + (twin,)))


def test_to_dict_is_json():
    plan = weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["peak_bytes"] == plan.peak_bytes and data["missing"] == []
    assert any("gate_up_proj" in t for row in data["rows"] for t in row["targets"])


def test_budget_below_the_model_raises_with_the_minimum():
    plan = weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral")
    with pytest.raises(BudgetError) as err:
        weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral", budget=100)
    assert err.value.minimum_bytes == plan.peak_bytes
    assert weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral",
                              budget=plan.peak_bytes).peak_bytes <= plan.peak_bytes


@pytest.mark.parametrize("bad", ["lots", "-1GB", "8 parsecs"])
def test_bad_budget_string(bad):
    with pytest.raises(PlanError, match="budget"):
        weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral", budget=bad)


def test_options_are_validated():
    with pytest.raises(PlanError, match="threads"):
        weightplan.explain(moe_model(), moe_checkpoint(), threads=-1)
    with pytest.raises(PlanError, match="dtype"):
        weightplan.explain(moe_model(), moe_checkpoint(), dtype="float7")
    with pytest.raises(PlanError, match="TensorParallel"):
        weightplan.explain(moe_model(), moe_checkpoint(), tp={"world_size": 2})


def test_sync_env_var_runs_inline(monkeypatch):
    monkeypatch.setenv("WEIGHTPLAN_SYNC_LOAD", "1")
    plan = weightplan.explain(moe_model(), moe_checkpoint(), mapping="mixtral", threads=8)
    assert plan.options.threads == 0
