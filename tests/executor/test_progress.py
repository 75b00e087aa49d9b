"""The progress bar: bytes, speed and ETA on a terminal; silent otherwise or when asked."""

import io
import sys

from rich.progress import DownloadColumn, TimeRemainingColumn, TransferSpeedColumn

import weightplan
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
