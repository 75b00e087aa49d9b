"""The command's exit statuses, one per class of failure (``weightplan/cli_status.py``):
bad arguments 2, an unreadable checkpoint 3, an interrupted save 4, any other error 5, a
bug 6; each an error line on stderr and nothing on stdout, ``--json`` included. Was: 2 for
every one of them, so a script couldn't tell a typo in its flags from a corrupt file, a
directory to recover or a bug."""

import pytest

from weightplan import cli
from weightplan.cli import build_parser, main
from weightplan.errors import UnexpectedError
from weightplan.planner.inputs.paths import JOURNAL_NAME

from tests.conftest import moe_checkpoint, write_checkpoint

MIXTRAL = ["--model-type", "mixtral"]


@pytest.fixture
def dirs(tmp_path):
    good = write_checkpoint(tmp_path / "good", moe_checkpoint())
    data = (good / "model.safetensors").read_bytes()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.safetensors").write_bytes(b"\xff" * 7 + b"\x7f" + data[8:])
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "model.safetensors").write_bytes(data[:len(data) // 2])
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    interrupted = write_checkpoint(tmp_path / "interrupted", moe_checkpoint())
    (interrupted / JOURNAL_NAME).write_text(
        '{"weightplan_commit": 1, "renames": [], "deletes": []}')
    return tmp_path


CASES = [
    ("bad flag", ["explain", "good", "--tpp", "2"], 2, ""),
    ("flag without the one it needs", ["explain", "good", *MIXTRAL, "--ep"], 2, "--ep needs"),
    ("a picture into no directory", ["explain", "good", *MIXTRAL, "--svg", "no/dir/p.svg"], 2,
     "no/dir"),
    ("missing path", ["explain", "nothing-here"], 3, "CheckpointError"),
    ("missing path, --json", ["explain", "nothing-here", "--json"], 3, "CheckpointError"),
    ("not a checkpoint", ["explain", "notes.txt", *MIXTRAL], 3, "NotSafetensorsError"),
    ("corrupt header", ["explain", "corrupt", *MIXTRAL, "--json"], 3, "NotSafetensorsError"),
    ("truncated", ["explain", "truncated", *MIXTRAL], 3, "TruncatedCheckpointError"),
    ("convert a missing source", ["convert", "nothing-here", "out", *MIXTRAL], 3,
     "CheckpointError"),
    ("recover a missing directory", ["recover", "nothing-here"], 3, "no such directory"),
    ("recover a file", ["recover", "notes.txt"], 3, "not a directory"),
    ("interrupted save", ["explain", "interrupted", *MIXTRAL], 4, "weightplan recover"),
    ("convert into an interrupted save", ["convert", "good", "interrupted", *MIXTRAL,
                                          "--overwrite"], 4, "InterruptedSaveError"),
    ("no such mapping", ["explain", "good", "--model-type", "no_such_family"], 5,
     "RegistryError"),
    ("budget too small", ["explain", "good", *MIXTRAL, "--budget", "10B"], 5, "BudgetError"),
    ("convert into a checkpoint", ["convert", "good", "good", *MIXTRAL], 5, "--overwrite"),
]


@pytest.mark.parametrize("name, argv, status, says", CASES, ids=[c[0] for c in CASES])
def test_each_class_of_failure_has_its_status(name, argv, status, says, dirs, capsys,
                                              monkeypatch):
    monkeypatch.chdir(dirs)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out, err = capsys.readouterr()
    assert code == status, (name, err)
    assert not out and err.count("\n") == 1 and says in err, (out, err)


@pytest.mark.parametrize("error", [ZeroDivisionError("oops"), UnexpectedError("wrapped")])
def test_a_bug_exits_6(error, dirs, capsys, monkeypatch):
    def broken(args):
        raise error

    monkeypatch.setattr(cli, "_dispatch", broken)
    assert main(["explain", str(dirs / "good")]) == 6
    assert "please report" not in capsys.readouterr().out


def test_a_directory_another_save_holds_exits_7(dirs, capsys):
    """(was 2, as every error; a script can wait and run it again)"""
    from weightplan.executor.dir_lock import directory_lock

    target = dirs / "target"
    target.mkdir()
    with directory_lock(target, "save"):
        assert main(["recover", str(target)]) == 7
        out, err = capsys.readouterr()
        assert not out and err.count("\n") == 1 and "ConcurrentSaveError" in err, err
        assert main(["convert", str(dirs / "good"), str(target), *MIXTRAL]) == 7
        assert "ConcurrentSaveError" in capsys.readouterr().err


def test_every_status_is_in_the_help_and_the_readme():
    from pathlib import Path

    epilog = build_parser().epilog
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for status in range(8):
        assert f"\n    {status}    " in epilog, status
        assert f"`{status}`" in readme, status
    assert "weightplan recover DIR" in epilog


def status_of(err: str) -> int:
    """The status the error line ``err`` (the command's stderr) must come with: argparse's
    refusals 2, a weightplan error its class's (for the tests that check many errors)."""
    import re

    from weightplan import errors

    named = re.match(r"weightplan: error: (unexpected )?(\w+):", err)
    if named is None:  # argparse: 'weightplan explain: error: argument --tp: ...'
        assert re.match(r"weightplan( \w+)?: error: ", err), err
        return 2
    if named.group(1):
        return 6
    error = getattr(errors, named.group(2))
    return cli.error_status(error.__new__(error))


def test_the_status_of_an_error_line():
    assert status_of("weightplan explain: error: unrecognized arguments: --tpp\n") == 2
    assert status_of("weightplan: error: ArgumentError: --ep needs --tp\n") == 2
    assert status_of("weightplan: error: HeaderError: x: bad\n") == 3
    assert status_of("weightplan: error: InterruptedSaveError: d: run recover\n") == 4
    assert status_of("weightplan: error: BudgetError: no schedule fits\n") == 5
    assert status_of("weightplan: error: unexpected ZeroDivisionError: oops\n") == 6
