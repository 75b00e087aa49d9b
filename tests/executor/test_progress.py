"""The progress bar advances once per read, by the bytes read, and logging names the logger."""

import logging

import weightplan
from weightplan.executor import progress as progress_module

from tests.conftest import moe_model


def test_the_bar_advances_per_read(moe_dir, monkeypatch):
    directory, _ = moe_dir
    advances = []
    monkeypatch.setattr(progress_module.LoadProgress, "advance",
                        lambda self, n: advances.append(n))
    plan = weightplan.explain(moe_model(), directory, mapping="mixtral", threads=2)
    plan.execute(progress=True)
    reads = sum(len(t.pieces) for p in plan.schedule.steps for t in p.reads)
    assert len(advances) == reads > len(plan.schedule.steps)
    assert sum(advances) == plan.read_bytes


def test_messages_go_through_the_weightplan_logger(moe_dir, caplog):
    directory, _ = moe_dir
    model = moe_model()
    model.extra = __import__("torch").nn.Linear(2, 2, device="meta")
    with caplog.at_level(logging.WARNING):
        weightplan.load(model, directory, mapping="mixtral")
    assert [r.name for r in caplog.records] == ["weightplan"]
