"""Issue 21 items 1, 2, 4, 9: a save never writes outside its target and never loses the
old checkpoint.

Real files as an attacker (or an unlucky user) leaves them: symlinks planted at the names
a save's temporaries used to have, at the lock's name, at ``config.json`` (a Hugging Face
cache snapshot links it to a shared blob); a file-size limit that makes ``config.json``'s
write fail halfway (as a full disk does); a directory where a shard goes.
"""

from __future__ import annotations

import os
import resource
import signal

import pytest
import torch

import weightplan
from weightplan.errors import SaveError
from weightplan.executor import writer
from weightplan.executor.commit import PARTIAL, recover
from weightplan.executor.dir_lock import LOCK_NAME
from weightplan.planner.inputs.paths import JOURNAL_NAME

from .helpers import load_tensors
from .save_child import KEYS, filled_model

LIKE = {k: torch.zeros(8, 8) for k in KEYS}


def _save(directory, seed: float, shard=300, **kwargs) -> None:
    weightplan.save(filled_model(seed), directory, max_shard_size=shard, overwrite=True,
                    threads=0, progress=False, **kwargs)


def _seed(directory) -> float:
    got = load_tensors(directory, LIKE)
    seeds = {got[k][0, 0].item() - i for i, k in enumerate(KEYS)}
    assert len(seeds) == 1, f"a mix of checkpoints: {seeds}"
    return seeds.pop()


def _victims(tmp_path, names) -> dict:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    victims = {}
    for i, name in enumerate(names):
        victims[name] = outside / f"victim{i}"
        victims[name].write_text("keep me")
    return victims


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(PARTIAL) or n in (
        JOURNAL_NAME, LOCK_NAME))


def test_symlinks_planted_at_the_old_temporary_names_are_never_written_through(tmp_path):
    directory = tmp_path / "ckpt"
    _save(directory, 1.0)
    plan = weightplan.explain_save(filled_model(2.0), directory, max_shard_size=300,
                                   overwrite=True)
    names = [f".{n}{PARTIAL}" for n in (*plan.layout.names, "weightplan-commit.json")]
    victims = _victims(tmp_path, names)
    for name, victim in victims.items():
        (directory / name).symlink_to(victim)
    _save(directory, 2.0)
    assert [v.read_text() for v in victims.values()] == ["keep me"] * len(victims)
    assert _seed(directory) == 2.0


def test_a_symlink_at_this_saves_own_temporary_name_fails_closed(tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    _save(directory, 1.0)
    token = "0123456789abcdef"
    monkeypatch.setattr(writer, "new_token", lambda: token)
    plan = weightplan.explain_save(filled_model(2.0), directory, max_shard_size=300,
                                   overwrite=True)
    for final in (plan.layout.names[1], "model.safetensors.index.json"):
        victim = _victims(tmp_path, [final])[final]
        link = directory / f".{final}.{token}{PARTIAL}"
        link.symlink_to(victim)
        with pytest.raises(SaveError, match="refusing to write through it"):
            _save(directory, 2.0)
        assert victim.read_text() == "keep me"
        assert _seed(directory) == 1.0
        assert _leftovers(directory) == [link.name]  # only the planted link; ours are gone
        link.unlink()


def test_a_symlink_at_the_lock_name_fails_closed(tmp_path):
    directory = tmp_path / "ckpt"
    _save(directory, 1.0)
    victim = _victims(tmp_path, ["lock"])["lock"]
    (directory / LOCK_NAME).symlink_to(victim)
    with pytest.raises(SaveError, match="symbolic link"):
        _save(directory, 2.0)
    assert victim.read_text() == "keep me" and _seed(directory) == 1.0


transformers = pytest.importorskip("transformers")


def _llama(seed: float, **extra) -> torch.nn.Module:
    torch.manual_seed(int(seed))
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, **extra)
    return transformers.LlamaForCausalLM(config)


def test_a_hub_cache_snapshot_keeps_its_shared_blobs(tmp_path):
    """config.json → ../../blobs/<sha>: the save replaces the link, the blob stays."""
    source = tmp_path / "source"
    weightplan.save(_llama(1), source, progress=False)
    blobs, snapshot = tmp_path / "hub/blobs", tmp_path / "hub/snapshots/abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    before = {}
    for name in os.listdir(source):
        blob = blobs / f"sha-{name}"
        blob.write_bytes((source / name).read_bytes())
        before[blob] = blob.read_bytes()
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    model = _llama(2)
    weightplan.save(model, snapshot, overwrite=True, progress=False)
    assert {blob: blob.read_bytes() for blob in before} == before
    assert not (snapshot / "config.json").is_symlink()
    assert weightplan.from_pretrained(snapshot, dtype=None).state_dict().keys() == \
        model.state_dict().keys()


def test_a_planted_config_link_rewrites_nothing_outside(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    victims = _victims(tmp_path, ["config.json", "generation_config.json"])
    for name, victim in victims.items():
        (directory / name).symlink_to(victim)
    weightplan.save(_llama(1), directory, progress=False)
    assert [v.read_text() for v in victims.values()] == ["keep me"] * 2
    assert '"LlamaForCausalLM"' in (directory / "config.json").read_text()


def test_a_full_disk_while_writing_the_config_keeps_the_old_checkpoint(tmp_path):
    """RLIMIT_FSIZE makes the write of a file past 64 KiB fail halfway (EFBIG, as ENOSPC
    would): the shards fit, the new config.json (a 200 KB attribute) does not."""
    directory = tmp_path / "ckpt"
    weightplan.save(_llama(1), directory, progress=False)
    old = {n: (directory / n).read_bytes() for n in os.listdir(directory)}
    pid = os.fork()
    if pid == 0:  # child: the save under the limit; exit 3 for a SaveError
        code = 1
        try:
            torch.set_num_threads(1)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
            weightplan.save(_llama(2, notes="x" * 200_000), directory, overwrite=True,
                            progress=False)
            code = 0
        except SaveError:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, status
    assert {n: (directory / n).read_bytes() for n in os.listdir(directory)} == old


def test_a_directory_where_a_checkpoint_file_goes_is_refused_up_front(tmp_path):
    """A shard's name, the index's, config.json's, or a stale shard the save would delete."""
    directory = tmp_path / "ckpt"
    _save(directory, 1.0, shard="1GB")
    plan = weightplan.explain_save(filled_model(2.0), directory, max_shard_size=300,
                                   overwrite=True)
    for name in (plan.layout.names[1], "model.safetensors.index.json",
                 "model-00009-of-00009.safetensors"):
        (directory / name).mkdir()
        with pytest.raises(SaveError, match="is a directory"):
            _save(directory, 2.0)
        assert _leftovers(directory) == [] and _seed(directory / "model.safetensors") == 1.0
        assert "nothing to do" in recover(directory)
        (directory / name).rmdir()
    _save(directory, 2.0)
    assert _seed(directory) == 2.0
