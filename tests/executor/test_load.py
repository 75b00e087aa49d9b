"""Loading: values, in-place writes, casts, op paths, errors before any write, reports."""

import os
import sys

import pytest
import torch
from torch import nn

import weightplan
from weightplan import WeightConverter
from weightplan.errors import (
    ExecutionError, PlanError, ShapeMismatchError, StaleCheckpointError, StrictLoadError,
)
from weightplan.ops import (
    Chunk, MergeModulelist, PermuteForRope, SplitModulelist, Transpose,
)

from tests.conftest import (
    Doubler, expected_moe, module_with, moe_checkpoint, moe_model, write_checkpoint,
)


def state(model):
    return {k: v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("threads", [0, 1, 4])
def test_mixtral_legacy_checkpoint_loads_exactly(moe_dir, threads):
    directory, ckpt = moe_dir
    model = moe_model()
    report = weightplan.load(model, directory, mapping="mixtral", threads=threads)
    got, want = state(model), expected_moe(ckpt)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert all(not p.is_meta for p in model.parameters())
    assert report.bytes_read == sum(t.nbytes for t in ckpt.values())
    assert report.tensors_loaded == len(want)
    assert report.threads == min(threads, os.cpu_count())


def test_allocated_model_is_written_in_place(moe_dir):
    directory, ckpt = moe_dir
    model = moe_model(device="cpu")
    pointers = {k: v.data_ptr() for k, v in state(model).items()}
    report = weightplan.load(model, directory, mapping="mixtral")
    assert {k: v.data_ptr() for k, v in state(model).items()} == pointers
    want = expected_moe(ckpt)
    assert all(torch.equal(state(model)[k], want[k]) for k in want)
    largest = max(t.nbytes for t in ckpt.values())
    assert 0 < report.peak_bytes <= report.planned_peak_bytes <= 4 * largest


def test_in_memory_dict_checkpoint():
    ckpt = moe_checkpoint()
    model = moe_model()
    weightplan.load(model, ckpt, mapping="mixtral")
    want = expected_moe(ckpt)
    assert all(torch.equal(state(model)[k], want[k]) for k in want)


def test_bf16_checkpoint_into_fp32_model_casts(tmp_path):
    ckpt = moe_checkpoint(dtype=torch.bfloat16)
    directory = write_checkpoint(tmp_path / "c", ckpt)
    model = moe_model(dtype=torch.float32)
    weightplan.load(model, directory, mapping="mixtral")
    want = expected_moe(ckpt)
    assert all(torch.equal(state(model)[k], want[k].float()) for k in want)


def test_qkv_chunk_reads_each_piece_into_its_parameter(tmp_path):
    qkv = torch.randn(16, 8)
    directory = write_checkpoint(tmp_path / "c", {"attn.qkv.weight": qkv})
    model = module_with({f"attn.{n}.weight": ((r, 8), torch.float32)
                         for n, r in (("q", 8), ("k", 4), ("v", 4))})
    conv = WeightConverter("qkv.weight", ["q.weight", "k.weight", "v.weight"], [Chunk(0)])
    plan = weightplan.explain(model, directory, mapping=[conv])
    assert all(r.direct for p in plan.schedule.steps for r in p.reads)
    plan.execute()
    assert torch.equal(model.attn.q.weight, qkv[:8]) and torch.equal(model.attn.v.weight, qkv[12:])


def test_fused_checkpoint_into_per_expert_model_splits(tmp_path):
    fused = torch.randn(4, 6, 8)
    directory = write_checkpoint(tmp_path / "c", {"experts.gate": fused})
    model = module_with({f"experts.{e}.gate.weight": ((6, 8), torch.float32) for e in range(4)})
    conv = WeightConverter("experts.gate", "experts.*.gate.weight", [SplitModulelist(0)])
    weightplan.load(model, directory, mapping=[conv])
    assert all(torch.equal(getattr(model.experts, str(e)).gate.weight, fused[e]) for e in range(4))


def test_transpose_and_rope_go_through_a_temporary(tmp_path):
    w, q = torch.randn(5, 7), torch.randn(16, 4)
    directory = write_checkpoint(tmp_path / "c", {"fc": w, "q": q})
    model = module_with({"proj": ((7, 5), torch.float32), "q_proj": ((16, 4), torch.float32)})
    convs = [WeightConverter("fc", "proj", [Transpose(0, 1)]),
             WeightConverter("^q$", "q_proj", [PermuteForRope(head_dim=4)])]
    plan = weightplan.explain(model, directory, mapping=convs)
    assert not any(r.direct for p in plan.schedule.steps for r in p.reads)
    plan.execute()
    assert torch.equal(model.proj, w.T)
    assert torch.equal(model.q_proj, q.view(4, 2, 2, 4).transpose(1, 2).reshape(16, 4))


def test_user_op_runs_materialized_then_merges_in_place(tmp_path):
    ckpt = {f"e.{i}.w": torch.randn(3, 2) for i in range(3)}
    directory = write_checkpoint(tmp_path / "c", ckpt)
    model = module_with({"stacked": ((3, 3, 2), torch.float32)})
    conv = WeightConverter("e.*.w", "stacked", [Doubler(), MergeModulelist(0)])
    plan = weightplan.explain(model, directory, mapping=[conv])
    (program,) = plan.schedule.steps
    assert program.ops == (conv.operations[0],)
    plan.execute()
    assert torch.equal(model.stacked, torch.stack([ckpt[f"e.{i}.w"] * 2 for i in range(3)]))


class Exploding(Doubler):
    """Infers fine on meta tensors, fails on real ones."""

    def forward(self, streams):
        if not streams[0][0].is_meta:
            raise RuntimeError("boom")
        return streams


def test_failing_op_leaves_a_meta_model_untouched(tmp_path):
    directory = write_checkpoint(tmp_path / "c", {"a": torch.ones(2), "x": torch.ones(2)})
    model = module_with({"a": ((2,), torch.float32), "y": ((2,), torch.float32)})
    plan = weightplan.explain(model, directory, mapping=[WeightConverter("^x$", "y", [Exploding()])])
    with pytest.raises(ExecutionError, match=r"op #0 .*boom"):
        plan.execute()
    assert model.a.is_meta and model.y.is_meta


def test_mismatch_raises_before_anything_is_written(moe_dir):
    directory, _ = moe_dir
    model = moe_model(device="cpu")
    getattr(model.model.layers, "0").LayerNorm.weight = nn.Parameter(torch.zeros(9))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3.0)
    before = {k: v.clone() for k, v in state(model).items()}
    with pytest.raises(ShapeMismatchError, match=r"LayerNorm.weight.*\[8\].*\[9\]") as e:
        weightplan.load(model, directory, mapping="mixtral")
    assert str(e.value).startswith("1 tensor doesn't fit the model"), str(e.value)  # was tensor(s) don't
    assert all(torch.equal(before[k], v) for k, v in state(model).items())


def test_strict_raises_before_loading_and_lenient_initializes(moe_dir, caplog):
    directory, _ = moe_dir
    model = moe_model()
    model.extra = nn.Linear(3, 2, device="meta")
    with pytest.raises(StrictLoadError) as caught:
        weightplan.load(model, directory, mapping="mixtral", strict=True)
    # what there is, said once ("and 0 unexpected ()" was said too)
    assert str(caught.value) == ("strict load: 2 missing [extra.bias, extra.weight]; nothing "
                                 "was loaded")
    assert model.extra.weight.is_meta and model.model.embed_tokens.weight.is_meta
    with caplog.at_level("WARNING", logger="weightplan"):
        report = weightplan.load(model, directory, mapping="mixtral")
    assert "2 missing tensors [extra.bias, extra.weight]" in caplog.text
    assert caplog.messages[-1] == ("2 missing tensors [extra.bias, extra.weight] (2 "
                                   "initialized by the model's own init)")
    assert report.initialized["extra.weight"] == "Linear.reset_parameters()"
    assert not model.extra.weight.is_meta and model.extra.weight.abs().sum() > 0


def test_checkpoint_changed_after_planning(moe_dir):
    directory, _ = moe_dir
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    shard = next(directory.glob("*.safetensors"))
    os.utime(shard, ns=(0, 0))
    with pytest.raises(StaleCheckpointError, match=shard.name):
        plan.execute()


def test_executing_a_plan_twice_is_refused(moe_dir):
    directory, _ = moe_dir
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    plan.execute()
    with pytest.raises(PlanError, match="changed since explain"):
        plan.execute()


def test_plan_without_model_cannot_execute(moe_dir):
    with pytest.raises(PlanError, match="no model"):
        weightplan.explain(None, moe_dir[0], mapping="mixtral").execute()


def test_report_and_estimate(moe_dir):
    directory, ckpt = moe_dir
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral")
    report = plan.execute()
    assert report.peak_bytes <= plan.peak_bytes == report.planned_peak_bytes
    assert report.bytes_needed == report.bytes_read
    assert report.seconds > 0 and report.gb_per_s > 0
    assert "loaded" in str(report) and report.to_dict()["tensors_loaded"] == report.tensors_loaded


def test_progress_is_silent_without_a_tty(moe_dir, capsys):
    directory, _ = moe_dir
    assert not sys.stderr.isatty()
    weightplan.load(moe_model(), directory, mapping="mixtral")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_the_lenient_loads_warning_counts_in_words(tmp_path, caplog):
    """'1 missing tensor(s) [score.weight]': found loading a causal LM's checkpoint with
    model_class=AutoModelForSequenceClassification; said as the plan's headers say counts."""
    write_checkpoint(tmp_path / "c", {"a.weight": torch.ones(2), "old.weight": torch.ones(2)})
    model = module_with({"a.weight": ((2,), torch.float32), "b.weight": ((2,), torch.float32)},
                        device="cpu")
    with caplog.at_level("WARNING", logger="weightplan"):
        weightplan.load(model, tmp_path / "c")
    assert caplog.messages[-1] == ("1 missing tensor [b.weight] (0 initialized by the model's "
                                   "own init) and 1 unexpected checkpoint key [old.weight] not "
                                   "loaded"), caplog.messages
