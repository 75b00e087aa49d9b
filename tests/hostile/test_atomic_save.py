"""Deliverable 4: a save is atomic at every step, including the commit.

After a failure or a kill -9 at any step, the directory holds the old checkpoint intact,
or the new one complete, or an interrupted save that every load refuses (and
``recover`` completes) - never a mix. Each scenario records the save's steps once, then
fails (OSError) and kills (SIGKILL, in a forked child) at every one of them.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

import weightplan
from weightplan.errors import InterruptedSaveError, SaveError, WeightplanError
from weightplan.executor import commit as commit_mod
from weightplan.executor.commit import PARTIAL, recover
from weightplan.planner.inputs.paths import JOURNAL_NAME

from .helpers import load_tensors, meta_model

KEYS = [f"layer{i}.weight" for i in range(6)]


def _model(seed: float) -> torch.nn.Module:
    tensors = {k: torch.full((8, 8), seed + i) for i, k in enumerate(KEYS)}
    model = meta_model(tensors)
    for k, v in tensors.items():
        module, attr = model.get_submodule(k.rsplit(".", 1)[0]), k.rsplit(".", 1)[1]
        module._parameters[attr] = torch.nn.Parameter(v, requires_grad=False)
    return model


def _state(seed: float) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in _model(seed).state_dict().items()}


OLD, NEW = _state(1.0), _state(100.0)
SCENARIOS = {  # (old max_shard_size, new max_shard_size): layouts that differ
    "sharded->fewer shards": (300, 800),
    "single->sharded": ("1GB", 300),
    "sharded->single": (300, "1GB"),
}


def _save(directory, seed: float, shard, overwrite: bool = True):
    weightplan.save(_model(seed), directory, max_shard_size=shard, overwrite=overwrite,
                    threads=0, progress=False)


def _steps(tmp_path, old_shard, new_shard) -> list[str]:
    directory = tmp_path / "record"
    _save(directory, 1.0, old_shard, overwrite=False)
    seen: list[str] = []
    commit_mod.STEP_HOOK = seen.append
    try:
        _save(directory, 100.0, new_shard)
    finally:
        commit_mod.STEP_HOOK = None
    assert _outcome(directory) == "new"
    return seen


def _outcome(directory) -> str:
    """'old' / 'new' (loaded exactly) or 'interrupted' (refused with the typed error)."""
    try:
        got = load_tensors(directory, OLD)
    except InterruptedSaveError as e:
        assert "weightplan recover" in str(e)
        for name in os.listdir(directory):  # every file of it is refused too
            if name.endswith(".safetensors"):
                with pytest.raises(InterruptedSaveError):
                    weightplan.explain(None, directory / name)
        return "interrupted"
    for label, want in (("old", OLD), ("new", NEW)):
        if all(torch.equal(got[k], want[k]) for k in KEYS):
            return label
    raise AssertionError(f"a mix of two checkpoints: {[got[k][0, 0].item() for k in KEYS]}")


def _check_after_interruption(directory, journal_written: bool) -> None:
    outcome = _outcome(directory)
    if not journal_written:
        assert outcome == "old"
    assert outcome in ("old", "new", "interrupted")
    if outcome == "interrupted":
        assert "completed" in recover(directory)
        assert _outcome(directory) == "new"
    recover(directory)  # removes orphaned temporaries
    assert not [n for n in os.listdir(directory) if n.endswith(PARTIAL) or n == JOURNAL_NAME]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_failure_at_every_step(tmp_path, scenario):
    old_shard, new_shard = SCENARIOS[scenario]
    steps = _steps(tmp_path, old_shard, new_shard)
    assert "journal" in steps and any(s.startswith("rename") for s in steps)
    for i, name in enumerate(steps):
        directory = tmp_path / f"fail{i}"
        _save(directory, 1.0, old_shard, overwrite=False)

        def fail(step, name=name):
            if step == name:
                raise OSError(5, f"injected failure at {step}")

        commit_mod.STEP_HOOK = fail
        try:
            with pytest.raises(WeightplanError) as info:
                _save(directory, 100.0, new_shard)
        finally:
            commit_mod.STEP_HOOK = None
        assert isinstance(info.value, SaveError), info.value
        journal_written = steps.index("journal") <= i
        if not journal_written:
            assert not [n for n in os.listdir(directory) if n.endswith(PARTIAL)], name
        _check_after_interruption(directory, journal_written)


def _killed_save(directory, new_shard, at: str) -> int:
    pid = os.fork()
    if pid == 0:  # child: kill -9 itself at step ``at``
        try:
            torch.set_num_threads(1)

            def kill(step):
                if step == at:
                    os.kill(os.getpid(), signal.SIGKILL)

            commit_mod.STEP_HOOK = kill
            _save(directory, 100.0, new_shard)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize("scenario", ["sharded->fewer shards", "single->sharded"])
def test_kill_9_at_every_step(tmp_path, scenario):
    old_shard, new_shard = SCENARIOS[scenario]
    steps = _steps(tmp_path, old_shard, new_shard)
    for i, name in enumerate(steps):
        directory = tmp_path / f"kill{i}"
        _save(directory, 1.0, old_shard, overwrite=False)
        status = _killed_save(directory, new_shard, name)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, name
        _check_after_interruption(directory, steps.index("journal") <= i)


def test_the_next_save_removes_the_temporaries_of_one_killed_before_its_commit(tmp_path):
    """A save killed before its journal leaves the old checkpoint and its temporaries
    (``.NAME.TOKEN.weightplan-partial``: as big as the new checkpoint). Saving again, as a
    user whose save was killed does, left them there for ever (only ``recover`` removed
    them; found by killing a sharded save and saving again). The next save holds the
    directory's lock, so no save is writing them: it removes them, as ``recover`` does."""
    directory = tmp_path / "d"
    _save(directory, 1.0, 300, overwrite=False)
    status = _killed_save(directory, 300, "shards synced")
    assert os.WIFSIGNALED(status)
    assert [n for n in os.listdir(directory) if n.endswith(PARTIAL)]  # (the kill's leftovers)
    _save(directory, 100.0, 300)
    assert _outcome(directory) == "new"
    assert not [n for n in os.listdir(directory) if n.endswith(PARTIAL)], os.listdir(directory)


def test_a_save_into_an_interrupted_directory_is_refused(tmp_path):
    directory = tmp_path / "d"
    _save(directory, 1.0, 300, overwrite=False)

    def fail(step):
        if step.startswith("delete"):
            raise OSError(5, "injected")

    commit_mod.STEP_HOOK = fail
    try:
        with pytest.raises(SaveError, match="recover"):
            _save(directory, 100.0, "1GB")
    finally:
        commit_mod.STEP_HOOK = None
    with pytest.raises(InterruptedSaveError) as refused:
        _save(directory, 5.0, 300)
    # the way out as a command to paste, and what to do then: save (it said "then load
    # again" to a save and to a convert, and "recover DIR"; found by a user saving again)
    assert f"Run `weightplan recover {directory}`" in str(refused.value), refused.value
    assert str(refused.value).endswith("then save again"), refused.value
    with pytest.raises(InterruptedSaveError, match="then load again"):
        weightplan.explain(_model(5.0), directory)
    recover(directory)
    assert _outcome(directory) == "new"


def test_recover_refuses_a_crafted_journal(tmp_path):
    directory = tmp_path / "d"
    _save(directory, 1.0, 300, overwrite=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (directory / JOURNAL_NAME).write_text(
        '{"weightplan_commit": 1, "renames": [], "deletes": ["../victim.txt"]}')
    with pytest.raises(InterruptedSaveError, match="never does"):
        recover(directory)
    (directory / JOURNAL_NAME).write_text(
        '{"weightplan_commit": 1, "renames": [["config.json", "model.safetensors"]], '
        '"deletes": []}')
    with pytest.raises(InterruptedSaveError, match="never does"):
        recover(directory)
    assert victim.read_text() == "keep me"


def test_cli_recover(tmp_path, capsys):
    from weightplan import cli

    directory = tmp_path / "d"
    _save(directory, 1.0, 300, overwrite=False)
    (directory / ".model.safetensors.weightplan-partial").write_bytes(b"orphan")
    assert cli.main(["recover", str(directory)]) == 0
    assert "removed 1 orphaned" in capsys.readouterr().out
    assert cli.main(["recover", str(directory)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert _outcome(directory) == "old"


def test_a_convert_into_an_interrupted_directory_is_refused_before_its_plan(tmp_path, capsys):
    """``weightplan convert SRC DST`` into a directory whose save was killed in its commit
    printed the whole plan, then the error (the writer's check, after the plan): a save's
    plan now refuses it with the other checks of its directory, before anything is said."""
    from weightplan.cli import main

    directory = tmp_path / "d"
    _save(directory, 1.0, 300, overwrite=False)
    status = _killed_save(directory, 300, "journal")
    assert os.WIFSIGNALED(status) and (directory / JOURNAL_NAME).exists()
    source = tmp_path / "src"
    _save(source, 7.0, "1GB", overwrite=False)
    assert main(["convert", str(source), str(directory), "--model-type", "mixtral",
                 "--overwrite"]) == 4
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "InterruptedSaveError" in err, (out, err)
    assert err.rstrip().endswith("then save again"), err
    with pytest.raises(InterruptedSaveError, match="then save again"):
        weightplan.explain_save(_model(5.0), directory, overwrite=True)
