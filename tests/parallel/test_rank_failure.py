"""A cooperative load where one rank fails before the broadcasts (gloo, 2 ranks, real
processes): the failing rank raises its own typed error, the other raises
:class:`~weightplan.errors.RankFailedError` naming that rank and its error, at once
(not after the process group's timeout), whether the failure is in planning (a corrupt
header), in the reads (the file cut short after planning) or, in ``from_pretrained``, before
planning (the rank's checkpoint copy missing); the group stays usable. A rank that leaves
the group during the broadcasts makes the others raise RankFailedError naming the tensor
being broadcast, not an unexpected gloo error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightplan import errors
from tests.parallel.conftest import torchrun
from tests.parallel.strided_fixtures import build

WORKER = Path(__file__).with_name("fail_worker.py")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank_failure")
    directory = build("llama", root / "ckpt")[0]
    out = root / "out"
    out.mkdir()
    torchrun(2, WORKER, str(out), str(directory), timeout=240)
    return {(s, r): json.loads((out / f"{s}.rank{r}.json").read_text())
            for s in (*STAGES, "die") for r in (0, 1) if (s, r) != ("die", 1)}


STAGES = {"plan": "to plan", "read": "to read its part",
          "build": "to find its checkpoint and build the model"}


@pytest.mark.parametrize("scenario", list(STAGES))
def test_every_rank_raises_when_one_fails_before_the_broadcasts(outcomes, scenario):
    failed, waiting = outcomes[scenario, 1], outcomes[scenario, 0]
    assert failed["type"] is not None and failed["type"] != "RankFailedError", failed
    assert issubclass(getattr(errors, failed["type"]), errors.WeightplanError), failed
    assert waiting["type"] == "RankFailedError", waiting
    assert waiting["failures"] == {"1": f"{failed['type']}: {failed['message']}"}
    assert "rank 1 of this cooperative load failed" in waiting["message"]
    assert failed["type"] in waiting["message"]
    assert f"failed {STAGES[scenario]}" in waiting["message"]


def test_a_rank_that_leaves_during_the_broadcasts_is_named(outcomes):
    waiting = outcomes["die", 0]
    assert waiting["type"] == "RankFailedError", waiting
    assert "its broadcast from rank" in waiting["message"], waiting
    assert "left the process group during the broadcasts" in waiting["message"], waiting
    assert waiting["message"].split(":")[0].startswith("model."), waiting  # the tensor first
