"""Issue 21 item 3: keys reach no terminal raw.

A key ``"z\\nproblems: none"`` used to forge a clean verdict in ``print(plan)`` and
``weightplan explain``; ``\\r\\x1b[2K\\x1b[1A`` erased lines, ``\\x1b]0;…\\x07`` retitled the
terminal, NUL and U+202E passed through. Every text output now escapes control, bidi and
invisible characters; ordinary keys print as before (tests/viz pins those outputs).
"""

from __future__ import annotations

import unicodedata

import torch

import weightplan
from weightplan.executor.report import LoadReport, SaveReport
from weightplan.terminal import terminal_text

from .helpers import entry, raw_file, run_cli, write

HOSTILE = ["z\nproblems: none", "a\r\x1b[2K\x1b[1A", "t\x1b]0;owned\x07", "n\x00ul",
           "r\u202eev", "tag\U000e0041", "ls\u2028x", "lone\x85c1"]


def _checkpoint(tmp_path):
    header, start = {}, 0
    for key in HOSTILE:
        header[key] = entry("F32", [2], start, start + 8)
        start += 8
    return write(tmp_path / "evil.safetensors", raw_file(header, bytes(start)))


def _unseen(text: str) -> list[str]:
    """Characters a terminal would act on or hide (newlines between lines excepted)."""
    return [c for line in text.split("\n") for c in line
            if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


def test_print_plan_escapes_every_hostile_key(tmp_path):
    text = str(weightplan.explain(None, _checkpoint(tmp_path)))
    assert _unseen(text) == []
    assert [line for line in text.splitlines() if line.startswith("problems")] == \
        ["problems: none"]
    for key in HOSTILE:
        assert terminal_text(key) in text


def test_cli_explain_escapes_keys(tmp_path):
    result = run_cli("explain", str(_checkpoint(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert _unseen(result.stdout) == [] and _unseen(result.stderr) == []
    assert "z\\nproblems: none" in result.stdout and "t\\x1b]0;owned\\x07" in result.stdout
    assert sum(line.startswith("problems") for line in result.stdout.splitlines()) == 1


def test_cli_errors_and_recover_escape_what_they_print(tmp_path):
    bad = {"x\x1b]0;owned\x07\u202e": entry("F99", [2], 0, 8)}  # an unknown dtype
    result = run_cli("explain", str(write(tmp_path / "bad.safetensors", raw_file(bad, bytes(8)))))
    assert result.returncode == 3 and "HeaderError" in result.stderr, result.stderr
    assert _unseen(result.stderr.rstrip("\n")) == [] and "\\x1b]0;owned\\x07\\u202e" in result.stderr
    directory = tmp_path / "dir\x1b[2J\u202e"
    directory.mkdir()
    result = run_cli("recover", str(directory))
    assert result.returncode == 0 and _unseen(result.stdout.rstrip("\n")) == []
    assert "dir\\x1b[2J\\u202e" in result.stdout


def test_ordinary_text_is_unchanged():
    for text in ("model.layers.0.mlp.experts.*.w1.weight", "ünïcödé 中文 κλειδί", "a\\x1b",
                 "/tmp/ckpt dir/model.safetensors"):
        assert terminal_text(text) == text


def test_repr_of_a_plan_escapes_its_path(tmp_path):
    directory = tmp_path / "x\x1b]0;owned\x07"
    directory.mkdir()
    plan = weightplan.explain(None, _checkpoint(directory))
    assert _unseen(repr(plan)) == [] and "x\\x1b]0;owned\\x07" in repr(plan)


def test_reports_and_the_load_warning_escape_names(tmp_path, caplog):
    load = LoadReport(bytes_read=8, bytes_needed=8, seconds=1.0, peak_bytes=8,
                      planned_peak_bytes=8, rss_peak_bytes=None, tensors_loaded=1, threads=1,
                      initialized={HOSTILE[0]: "zeros\x1b[2K"})
    save = SaveReport(directory=str(tmp_path / "d\x1b]0;x\x07"), files=("m\n.safetensors",),
                      bytes_written=8, tensors_written=1, seconds=1.0, peak_bytes=8,
                      planned_peak_bytes=8, rss_peak_bytes=None, threads=1)
    assert _unseen(str(load)) == [] and _unseen(str(save)) == []
    assert str(load).count("\n") == 2 and str(save).count("\n") == 1  # no forged line

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

    with caplog.at_level("WARNING", logger="weightplan"):
        weightplan.explain(Model(), _checkpoint(tmp_path)).execute()
    assert caplog.records and _unseen(caplog.text) == []
