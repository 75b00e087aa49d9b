"""Thread stress: many small reads racing into shared destinations must land exactly."""

import sys

import torch

import weightplan
from weightplan import WeightConverter
from weightplan.ops import Concatenate, MergeModulelist

from tests.conftest import module_with, write_checkpoint


def test_many_threads_many_small_reads(tmp_path, monkeypatch):
    import weightplan.planner.tensors.schedule.schedule as schedule
    monkeypatch.setattr(schedule, "effective_threads", lambda threads: threads)  # > CPUs
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        g = torch.Generator().manual_seed(0)
        ckpt = {f"layer.{layer}.e.{e}.{w}": torch.randn(3, 5, generator=g)
                for layer in range(6) for e in range(16) for w in ("a", "b")}
        directory = write_checkpoint(tmp_path / "c", ckpt, shards=3)
        conv = WeightConverter(["e.*.a", "e.*.b"], "fused", [MergeModulelist(0), Concatenate(1)])
        for attempt in range(3):
            model = module_with({f"layer.{layer}.fused": ((16, 6, 5), torch.float32) for layer in range(6)})
            weightplan.load(model, directory, mapping=[conv], threads=8)
            for layer in range(6):
                want = torch.cat([torch.stack([ckpt[f"layer.{layer}.e.{e}.{w}"] for e in range(16)])
                                  for w in ("a", "b")], dim=1)
                assert torch.equal(getattr(model.layer, str(layer)).fused, want), (attempt, layer)
    finally:
        sys.setswitchinterval(old)
