"""The progress bar: bytes, speed and ETA on a terminal; silent otherwise or when asked;
it advances per read. Messages go through the ``weightplan`` logger."""

import io
import logging
import sys

import torch

from rich.progress import DownloadColumn, TimeRemainingColumn, TransferSpeedColumn

import weightplan
from weightplan.executor import progress as progress_module
from weightplan.executor.progress import LoadProgress, wants_progress

from tests.conftest import moe_model


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def load_with_stderr(monkeypatch, directory, **kwargs) -> str:
    fake = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", fake)
    weightplan.load(moe_model(), directory, mapping="mixtral", **kwargs)
    return fake.getvalue()


def test_bar_shows_bytes_speed_and_eta_on_a_terminal(moe_dir, monkeypatch):
    directory, _ = moe_dir
    out = load_with_stderr(monkeypatch, directory)
    assert "loading" in out and "KiB" in out and "B/s" in out and "0:00:00" in out


def test_bar_columns():
    bar = LoadProgress(10, enabled=True)
    columns = {type(c) for c in bar._progress.columns}
    assert {DownloadColumn, TransferSpeedColumn, TimeRemainingColumn} <= columns


def test_progress_false_is_silent_even_on_a_terminal(moe_dir, monkeypatch):
    directory, _ = moe_dir
    assert load_with_stderr(monkeypatch, directory, progress=False) == ""


def test_silent_when_not_a_terminal(moe_dir, monkeypatch):
    directory, _ = moe_dir
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not wants_progress(None) and wants_progress(True) and not wants_progress(False)
    weightplan.load(moe_model(), directory, mapping="mixtral")
    assert sys.stderr.getvalue() == ""


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
    model.extra = torch.nn.Linear(2, 2, device="meta")
    with caplog.at_level(logging.WARNING):
        weightplan.load(model, directory, mapping="mixtral")
    assert [r.name for r in caplog.records] == ["weightplan"]


def test_a_notebook_gets_the_bar_and_rich_is_imported_only_for_one(monkeypatch):
    """Not a terminal: a notebook (IPython's kernel shell) still gets a bar; without
    IPython, rich isn't asked (nor imported by a load without a bar)."""
    import builtins
    import types

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    ZMQInteractiveShell = type("ZMQInteractiveShell", (), {})
    monkeypatch.setitem(sys.modules, "IPython", types.ModuleType("IPython"))
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    assert wants_progress(None)
    monkeypatch.delitem(sys.modules, "IPython")
    assert not wants_progress(None)
