"""A checkpoint storing both names of a declared tie (``lm_head.weight`` beside
``model.embed_tokens.weight``, ``tie_word_embeddings=True``) loaded with ``tp=`` on 2 gloo
ranks: the second name is sharded as the first, each rank compares its shards, and the
ranks agree. Equal values: tied again on every rank (also for a model transformers'
TP utilities prepared); different ones: two tensors on every rank, with the warning a
plain load gives; values equal in one rank's rows only: two tensors on every rank (the
ranks agree, none ties alone). Every rank's shards and the logits are what a plain load
gives. A rank whose load fails before the comparison: a typed error on each rank (the
others a ``RankFailedError`` naming it), none left waiting in the ranks' agreement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from tests.parallel.conftest import torchrun
from tests.parallel.tp_fixtures import configs
from tests.parallel.tp_load_worker import PROMPT

WORKER = Path(__file__).with_name("stored_ties_worker.py")
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
KINDS = {"equal": lambda e: e.clone(), "different": lambda e: torch.randn_like(e),
         "half": lambda e: torch.cat([e[:51], torch.randn_like(e[51:])])}  # (rank 1's rows)
JOBS = [("equal", "tp"), ("equal", "hand"), ("different", "tp"), ("half", "tp")]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("stored_ties_tp")
    cls, config = configs()["llamatied"]
    dirs = []
    for kind, head in KINDS.items():
        torch.manual_seed(0)
        cls(config).save_pretrained(root / kind)
        tensors = load_file(str(root / kind / "model.safetensors"))
        assert HEAD not in tensors  # (transformers saves a tie once)
        torch.manual_seed(1)
        tensors[HEAD] = head(tensors[EMBED]).contiguous()
        save_file(tensors, str(root / kind / "model.safetensors"), metadata={"format": "pt"})
        dirs.append(str(root / kind))
    out = root / "out"
    out.mkdir()
    torchrun(2, WORKER, str(out), *dirs, timeout=240)
    return root, out


@pytest.mark.parametrize("kind, how", JOBS)
def test_each_rank_holds_what_a_plain_load_gives_and_the_ranks_agree(loaded, kind, how):
    root, out = loaded
    stored = load_file(str(root / kind / "model.safetensors"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(root / kind,
                                                                  dtype=torch.float32)
    with torch.no_grad():
        want = reference(PROMPT).logits
    assert (reference.lm_head.weight is reference.model.embed_tokens.weight) == (kind == "equal")
    for rank in range(2):
        got = torch.load(out / f"{kind}.{how}.rank{rank}.pt")
        rows = slice(51 * rank, 51 * (rank + 1))
        assert torch.equal(got["embed"], stored[EMBED][rows]), rank
        assert torch.equal(got["head"], stored[HEAD][rows]), rank
        assert got["tied"] == (kind == "equal"), (rank, got["tied"])
        warned = [m for m in got["warned"] if "tie_word_embeddings=False" in m]
        if kind == "equal":
            assert not warned, warned
        else:
            assert len(warned) == 1 and HEAD in warned[0] and EMBED in warned[0], warned
        assert (got["logits"] - want).abs().max().item() <= 1e-5, rank


def test_a_rank_failing_before_the_comparison_fails_the_others_by_name(loaded):
    """Rank 1's reads fail: rank 0, done loading, would wait in the comparison's
    ``all_reduce`` until the group's timeout; it raises ``RankFailedError`` naming rank 1
    and its error instead."""
    _, out = loaded
    failed, other = (json.loads((out / f"fails.rank{r}.json").read_text()) for r in (1, 0))
    assert failed["type"] == "ExecutionError" and "Input/output error" in failed["message"]
    assert other["type"] == "RankFailedError", other
    assert "rank 1" in other["message"] and "Input/output error" in other["message"], other
