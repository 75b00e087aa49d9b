"""Issue 21 item 13: the commit journal is read like an untrusted checkpoint file.

A FIFO at the journal's name used to block ``weightplan recover`` forever (and every load
tells the user to run it), a link to ``/dev/zero`` grew until ``MemoryError``, a NUL byte
in a name gave a bare ``ValueError``. Each is now a typed error at once. ``recover`` runs
in a child process with a time and memory limit, so the old behaviour fails the test
instead of hanging it or exhausting the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from weightplan.errors import InterruptedSaveError
from weightplan.executor.commit import recover
from weightplan.executor.journal import MAX_JOURNAL_BYTES
from weightplan.planner.inputs.paths import JOURNAL_NAME

from .helpers import REPO
from .test_save_hijack import _save, _seed


def _recover_in_child(directory) -> subprocess.CompletedProcess:
    def limits() -> None:  # 1 GiB of address space: /dev/zero read whole dies quickly
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "weightplan.cli", "recover", str(directory)],
                          capture_output=True, text=True, env=env, timeout=60,
                          preexec_fn=limits)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_journal_that_is_no_regular_small_file_is_a_typed_error_at_once(tmp_path, kind):
    directory = tmp_path / "ckpt"
    _save(directory, 1.0)
    journal = directory / JOURNAL_NAME
    if kind == "fifo":
        os.mkfifo(journal)
    elif kind == "dev-zero":
        journal.symlink_to("/dev/zero")
    else:
        with open(journal, "wb") as f:
            f.truncate(MAX_JOURNAL_BYTES + 1)
    try:
        result = _recover_in_child(directory)
    except subprocess.TimeoutExpired:
        pytest.fail("recover blocked on the journal")
    assert result.returncode == 4, result.stderr
    assert "InterruptedSaveError" in result.stderr and JOURNAL_NAME in result.stderr
    assert "MemoryError" not in result.stderr
    journal.unlink()
    assert _seed(directory) == 1.0


@pytest.mark.parametrize("name", ["model\x00.safetensors", "model-\x1b[2K.safetensors"])
def test_control_characters_in_a_journal_name_are_refused(tmp_path, name):
    directory = tmp_path / "ckpt"
    _save(directory, 1.0)
    import json

    (directory / JOURNAL_NAME).write_text(json.dumps(
        {"weightplan_commit": 1, "renames": [], "deletes": [name]}))
    with pytest.raises(InterruptedSaveError, match="never does"):
        recover(directory)
    (directory / JOURNAL_NAME).write_text(json.dumps(
        {"weightplan_commit": 1, "renames": [[f".{name}.weightplan-partial", name]],
         "deletes": []}))
    with pytest.raises(InterruptedSaveError, match="never does"):
        recover(directory)
