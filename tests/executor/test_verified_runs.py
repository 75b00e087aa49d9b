"""What runs is what was verified: a bad lowering fails at plan time, before any byte is
read; convert()/revert() go through the same executor and verify."""

import pytest
import torch

import weightplan
from weightplan import WeightConverter
from weightplan.errors import GraphError
from weightplan.executor import run as run_module
from weightplan.ops import Concatenate, MergeModulelist

from tests.conftest import module_with, write_checkpoint


class LosesAHalf(Concatenate):
    """A user op whose place() forgets where its second input goes."""

    def place(self, outputs, inputs):
        placed = super().place(outputs, inputs)
        return None if placed is None else (placed[0], tuple(() for _ in placed[1]))


def test_a_place_that_leaves_a_hole_fails_at_plan_time(tmp_path, monkeypatch):
    ckpt = {"a": torch.randn(2, 3), "b": torch.randn(2, 3)}
    directory = write_checkpoint(tmp_path / "c", ckpt)
    model = module_with({"ab": ((4, 3), torch.float32)})
    conv = WeightConverter(["^a$", "^b$"], "ab", [LosesAHalf(0)])
    monkeypatch.setattr(run_module, "run_plan", lambda *a, **k: pytest.fail("executed"))
    with pytest.raises(GraphError, match="destination ab of step ab: fragments cover 6 of "
                                         "its 12 elements"):
        weightplan.explain(model, directory, mapping=[conv])


def test_convert_and_revert_run_through_the_executor(monkeypatch):
    calls = []
    real = run_module.run_plan

    def counting(schedule, checkpoint, sink, **kw):
        calls.append(type(sink).__name__)
        return real(schedule, checkpoint, sink, **kw)

    # weightplan.convert imports run_plan when it runs (not when weightplan is imported)
    monkeypatch.setattr(run_module, "run_plan", counting)
    tensors = {f"e.{i}.w": torch.randn(2, 3) for i in range(3)}
    mapping = [WeightConverter("e.*.w", "w", [MergeModulelist(0)])]
    out = weightplan.convert(tensors, mapping)
    assert torch.equal(out["w"], torch.stack(list(tensors.values())))
    back = weightplan.revert(out, mapping)
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
    assert calls == ["DictSink", "DictSink"]
    assert out["w"].untyped_storage().data_ptr() != back["e.0.w"].untyped_storage().data_ptr()


def test_a_read_split_into_pieces_lands_whole(tmp_path):
    """Reads over the piece size (32 MiB by default) are split across threads; with a
    small piece size the suite runs that path."""
    from weightplan.executor.dict_sink import DictSink
    from weightplan.planner.pipelines.load import choose_mapping
    from weightplan.planner.inputs.checkpoint import open_checkpoint
    from weightplan.planner.tensors.ir.build import SinkKind, build_conversions
    from weightplan.planner.pipelines.lower import lower
    from weightplan.planner.write.reverse import forward_groups

    ckpt = {f"e.{i}.w": torch.randn(10, 100) for i in range(3)}
    ckpt["big"] = torch.randn(1000)
    directory = write_checkpoint(tmp_path / "c", ckpt)
    source = open_checkpoint(directory)
    mapping = [WeightConverter("e.*.w", "w", [MergeModulelist(0)])]
    groups = forward_groups(choose_mapping(mapping, None), source)
    conversions = build_conversions(groups.groups, None, None, SinkKind.MEMORY)
    _, schedule = lower(conversions, source, order=tuple, threads=2, piece_bytes=1024)
    pieces = {r.entry.key: len(r.pieces) for s in schedule.steps for r in s.reads}
    assert pieces == {"e.0.w": 4, "e.1.w": 4, "e.2.w": 4, "big": 4}
    sink = DictSink()
    run_module.run_plan(schedule, source, sink, progress=False)
    assert torch.equal(sink.results["big"], ckpt["big"])
    assert torch.equal(sink.results["w"], torch.stack([ckpt[f"e.{i}.w"] for i in range(3)]))
