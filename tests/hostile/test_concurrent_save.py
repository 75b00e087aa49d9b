"""Issue 21 items 5-6: two saves into one directory, or ``recover`` during a save.

Real processes on real files: a save pauses inside its commit sequence (its temporaries
written, the directory's lock held); meanwhile a second save, or ``weightplan recover``,
runs in another process. The second one must be refused with a typed error naming the
first (its pid), touch nothing, and the first must then complete and leave exactly its
own checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from weightplan.executor.commit import PARTIAL

from .helpers import load_tensors, run_cli

HERE = Path(__file__).resolve().parent
KEYS = [f"layer{i}.weight" for i in range(6)]
LIKE = {k: torch.zeros(8, 8) for k in KEYS}


def _child(directory: Path, seed: float, at: str = "-", shard: int = 300) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{HERE.parents[1]}{os.pathsep}{HERE}")
    return subprocess.Popen([sys.executable, str(HERE / "save_child.py"), str(directory),
                             str(seed), at, str(shard)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _paused(directory: Path, seed: float, at: str) -> tuple[subprocess.Popen, int]:
    child = _child(directory, seed, at)
    line = child.stdout.readline().split()
    assert line[:1] == ["ready"], child.communicate(timeout=60)
    return child, int(line[1])


def _finish(child: subprocess.Popen) -> str:
    out, err = child.communicate("go\n", timeout=120)
    assert child.returncode == 0, err
    return out.strip()


def _seeds(directory: Path) -> list[float]:
    got = load_tensors(directory, LIKE)
    return [got[k][0, 0].item() - i for i, k in enumerate(KEYS)]


@pytest.mark.parametrize("at", ["created", "shards synced"])
def test_a_second_save_is_refused_naming_the_first(tmp_path, at):
    directory = tmp_path / "ckpt"
    first, pid = _paused(directory, 100.0, at)
    try:
        second = _child(directory, 200.0)
        out, err = second.communicate(timeout=120)
        assert out.startswith("typed ConcurrentSaveError"), out + err
        assert f"pid {pid}" in out and "save" in out
    finally:
        assert _finish(first) == "saved"
    assert _seeds(directory) == [100.0] * len(KEYS)
    assert not [n for n in os.listdir(directory) if n.startswith(".")]


def test_recover_during_a_save_is_refused_and_touches_nothing(tmp_path):
    directory = tmp_path / "ckpt"
    old = _child(directory, 1.0)
    assert _finish(old) == "saved"
    first, pid = _paused(directory, 100.0, "shards synced")
    try:
        temporaries = sorted(n for n in os.listdir(directory) if n.endswith(PARTIAL))
        assert temporaries
        result = run_cli("recover", str(directory))
        assert result.returncode != 0
        assert "ConcurrentSaveError" in result.stderr and f"pid {pid}" in result.stderr
        assert sorted(n for n in os.listdir(directory) if n.endswith(PARTIAL)) == temporaries
    finally:
        assert _finish(first) == "saved"
    assert _seeds(directory) == [100.0] * len(KEYS)
    assert "nothing to do" in run_cli("recover", str(directory)).stdout


def test_a_temporary_removed_by_another_process_fails_the_save_before_its_commit(tmp_path):
    """Not recover (it waits for the lock) but any other process: the journal would skip
    the missing rename and leave the old shard among the new ones."""
    directory = tmp_path / "ckpt"
    assert _finish(_child(directory, 1.0)) == "saved"
    first, _ = _paused(directory, 100.0, "shards synced")
    try:
        victim = sorted(n for n in os.listdir(directory) if n.endswith(PARTIAL))[1]
        os.unlink(directory / victim)
    finally:
        out = _finish(first)
    assert out.startswith("typed SaveError") and "vanished" in out, out
    assert _seeds(directory) == [1.0] * len(KEYS)
    assert not [n for n in os.listdir(directory) if n.startswith(".")]
