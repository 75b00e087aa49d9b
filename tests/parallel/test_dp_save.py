"""Saving a data × tensor parallel model (4 gloo ranks, real processes, a 2 × 2 mesh).

Every rank of the world calling ``save(model, DIR)`` (the default ``process_group``):
one checkpoint, written once by the world's first rank, and every call returns; one
replica saving alone (``process_group=`` its TP group): it writes, with no collective of
the world (the other replica is busy on its own group meanwhile); a group lacking ranks
the writer's gathers need: a typed error on each; a model without DTensors saved on a
group: written once; a rank whose plan fails: named at once by the others; a rank of the
other replica holding a parameter the others lack: refused by rank and key; a TP peer failing
after its gathers: every rank says the checkpoint was committed complete; a TP rank leaving
mid-save: a ``RankFailedError`` on every other rank, nothing written; the writer's disk
filling mid-save: its error on it, a ``RankFailedError`` naming it on the others, nothing
written. (2-rank cases: ``test_save_agreement.py``; NCCL is not tested: no GPU here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from weightplan import errors
from tests.parallel.conftest import torchrun
from tests.parallel.tp_fixtures import configs

WORKER = Path(__file__).with_name("dp_save_worker.py")
SCENARIOS = ("every", "replica1", "replica0", "narrow", "plain", "planfail", "extra", "after",
             "full", "dies")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_save")
    cls, config = configs()["llama"]
    torch.manual_seed(0)
    source = root / "llama"
    cls(config).save_pretrained(source)
    out = root / "out"
    out.mkdir()
    torchrun(4, WORKER, str(out), str(source), timeout=240)
    outcomes = {(s, r): json.loads((out / f"{s}.rank{r}.json").read_text())
                for s in SCENARIOS for r in range(4) if (s, r) != ("dies", 1)}
    return source, out, outcomes


def same_checkpoint(directory: Path, source: Path) -> None:
    from safetensors.torch import load_file

    original = load_file(str(source / "model.safetensors"))
    written = load_file(str(directory / "model.safetensors"))
    assert written.keys() == original.keys()
    for key, tensor in original.items():
        assert written[key].dtype == tensor.dtype and written[key].shape == tensor.shape, key
        assert torch.equal(written[key].view(torch.uint8), tensor.view(torch.uint8)), key
    assert (directory / "config.json").is_file()


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_every_rank_saving_writes_once_and_every_call_returns(saved):
    source, out, outcomes = saved
    assert all(outcomes["every", r]["type"] is None for r in range(4)), outcomes
    same_checkpoint(out / "every", source)
    assert files(out / "every") == files(out / "replica0")  # no lock, no temporaries left
    assert not any(name.startswith(".") for name in files(out / "every"))
    # the writer's TP group gathered and wrote; the other replica only agreed
    assert outcomes["every", 0]["seconds"] > 0 and outcomes["every", 2]["seconds"] == 0


@pytest.mark.parametrize("scenario", ["replica1", "replica0"])
def test_one_replica_saves_alone_on_its_tp_group(saved, scenario):
    source, out, outcomes = saved
    assert all(outcomes[scenario, r]["type"] is None for r in range(4)), outcomes
    same_checkpoint(out / scenario, source)


def test_a_plain_model_saved_on_a_group_is_written_once(saved):
    source, out, outcomes = saved
    assert all(outcomes["plain", r]["type"] is None for r in range(4)), outcomes
    assert [outcomes["plain", r]["seconds"] > 0 for r in range(4)] == [True, False, False, False]
    same_checkpoint(out / "plain", source)


def test_a_group_lacking_the_writers_tp_peers_is_refused_by_name(saved):
    _, out, outcomes = saved
    writer, other = outcomes["narrow", 0], outcomes["narrow", 2]
    assert writer["type"] == "SaveError" and "ranks [1]" in writer["message"], writer
    assert other["type"] == "RankFailedError" and "rank 0" in other["message"], other
    assert "SaveError" in other["message"]
    assert not (out / "narrow").exists()


def test_a_write_failing_on_the_writer_mid_save_fails_every_rank_and_leaves_nothing(saved):
    """The writer's disk full after its first tensor: it keeps taking part in the gathers
    its TP peer is in (else the peer waits in one while the writer waits in the agreement,
    until the group's timeout), then raises its own error; every other rank names it."""
    _, out, outcomes = saved
    writer = outcomes["full", 0]
    assert writer["type"] == "SaveError" and "No space left" in writer["message"], writer
    assert "model.safetensors" in writer["message"], writer
    for r in (1, 2, 3):
        result = outcomes["full", r]
        assert result["type"] == "RankFailedError", (r, result)
        assert "rank 0" in result["message"] and "No space left" in result["message"], result
    assert not (out / "full").exists() or files(out / "full") == []


def test_a_tp_rank_leaving_mid_save_is_a_typed_error_and_nothing_is_written(saved):
    _, out, outcomes = saved
    for r in (0, 2, 3):  # the writer, and the other replica waiting for its commit
        result = outcomes["dies", r]
        assert result["type"] == "RankFailedError", (r, result)
        assert "save" in result["message"], result
    assert issubclass(errors.RankFailedError, errors.WeightplanError)
    assert not (out / "dies").exists() or files(out / "dies") == []


def test_a_rank_whose_plan_fails_is_named_by_every_other_at_once(saved):
    _, out, outcomes = saved
    failed = outcomes["planfail", 3]
    assert failed["type"] == "SaveError" and "is not a directory" in failed["message"], failed
    for r in (0, 1, 2):
        result = outcomes["planfail", r]
        assert result["type"] == "RankFailedError", (r, result)
        assert result["message"].startswith("rank 3 of this save failed to plan the save")
        assert f"SaveError: {failed['message']}" in result["message"], result
        assert result["took"] < 15, result  # (the group's timeout is 30 s)
    assert not (out / "planfail").exists()


def test_a_replica_whose_model_differs_is_refused_by_rank_and_key(saved):
    _, out, outcomes = saved
    for r in range(4):
        result = outcomes["extra", r]
        assert result["type"] == "SaveError", (r, result)
        assert "rank 2: writes model.norm.extra (F32 [3]), which rank 0 (the writer) " \
               "doesn't" in result["message"], result
    assert not (out / "extra").exists()


def test_a_tp_peer_failing_after_its_gathers_says_the_checkpoint_is_complete(saved):
    source, out, outcomes = saved
    same_checkpoint(out / "after", source)
    committed = f"{out / 'after'}: the checkpoint was committed complete by rank 0 (its writer)"
    peer = outcomes["after", 1]
    assert peer["type"] == "ExecutionError", peer
    assert peer["message"].startswith(f"{committed}, but this rank failed: "), peer
    for r in (0, 2, 3):
        result = outcomes["after", r]
        assert result["type"] == "RankFailedError" and result["committed"] is True, (r, result)
        assert result["message"].startswith(f"{committed}, but rank 1 failed: "), result
        assert "the peer's own failure after its last gather" in result["message"], result
