"""Ranks saving together agree on their plans before the writer takes the directory, and
on how the save ended (2 gloo ranks, real processes, ``process_group=`` the world).

A rank whose plan fails makes the other raise ``RankFailedError`` naming it and its error
at once (it waited in a collective until the group's timeout before); ranks whose plans
differ (a key one lacks, a shape) are refused on every rank, naming the rank and the key,
with nothing written; a rank failing after the writer committed: every rank's error says
the checkpoint was committed complete, and what failed. (The 4-rank, 2 × 2 mesh
cases: ``test_dp_save.py``. NCCL is not tested: no GPU here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.parallel.conftest import torchrun

WORKER = Path(__file__).with_name("save_agree_worker.py")
SCENARIOS = ("planfail", "extra", "shape", "after", "apart")
GROUP_TIMEOUT_S = 30  # the worker's process group's


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("save_agreement")
    torchrun(2, WORKER, str(out), timeout=180)
    return out, {(s, r): json.loads((out / f"{s}.rank{r}.json").read_text())
                 for s in SCENARIOS for r in (0, 1)}


def test_a_rank_whose_plan_fails_is_named_on_the_other_at_once(saved):
    out, outcomes = saved
    failed, waiting = outcomes["planfail", 1], outcomes["planfail", 0]
    assert failed["type"] == "SaveError" and "is not a directory" in failed["message"], failed
    assert waiting["type"] == "RankFailedError", waiting
    assert waiting["message"].startswith("rank 1 of this save failed to plan the save"), waiting
    assert f"SaveError: {failed['message']}" in waiting["message"], waiting
    assert waiting["seconds"] < GROUP_TIMEOUT_S / 2, waiting  # (not the group's timeout)
    assert not waiting["committed"]
    assert not (out / "planfail").exists()


@pytest.mark.parametrize("scenario, words", [
    ("extra", "rank 1: writes 1.scale (F32 [3]), which rank 0 (the writer) doesn't"),
    ("shape", "rank 1: writes 0.bias as F32 [5], rank 0 (the writer) as F32 [4]")])
def test_ranks_whose_plans_differ_are_refused_by_rank_and_key(saved, scenario, words):
    out, outcomes = saved
    for rank in (0, 1):
        result = outcomes[scenario, rank]
        assert result["type"] == "SaveError", (rank, result)
        assert "planned different checkpoints" in result["message"], result
        assert words in result["message"], result
        assert "nothing was written" in result["message"], result
    assert not (out / scenario).exists()


def test_a_failure_after_the_commit_says_the_checkpoint_is_complete(saved):
    from safetensors.torch import load_file

    out, outcomes = saved
    committed = f"{out / 'after'}: the checkpoint was committed complete by rank 0 (its writer)"
    writer, failed = outcomes["after", 0], outcomes["after", 1]
    assert writer["type"] == "RankFailedError" and writer["committed"] is True, writer
    assert writer["message"] == (f"{committed}, but rank 1 failed: OSError: this "
                                 "rank's own failure after the run"), writer
    assert failed["type"] == "ExecutionError", failed
    assert failed["message"].startswith(f"{committed}, but this rank failed: OSError"), \
        failed
    assert set(load_file(str(out / "after" / "model.safetensors"))) == \
        {"0.weight", "0.bias", "1.weight", "1.bias"}


def test_a_failure_after_the_commit_names_the_writers_directory_where_paths_differ(saved):
    """Was: '{rank 1's path}: the checkpoint was committed complete by rank 0' on rank 1,
    whose path (per-node paths) holds nothing: the writer's directory was not said."""
    out, outcomes = saved
    committed = f"{out / 'apart'}: the checkpoint was committed complete by rank 0 (its writer)"
    writer, failed = outcomes["apart", 0], outcomes["apart", 1]
    assert writer["message"].startswith(f"{committed}, but rank 1 failed: OSError"), writer
    assert failed["type"] == "ExecutionError", failed
    assert failed["message"].startswith(
        f"{committed} (its directory: this rank's {out / 'apart1'} was not written), but this "
        "rank failed: OSError"), failed
    assert (out / "apart" / "model.safetensors").is_file() and not (out / "apart1").exists()
