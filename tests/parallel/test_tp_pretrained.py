"""``from_pretrained(dir, tp=...)`` returns a model that runs: under torchrun (gloo, 2 and 4
ranks, no process group started by the script) the forward of the returned model equals the
single-process logits for dense and MoE models, TP and EP, and every rank's parameters equal
transformers' own ``tp_plan="auto"`` / EP load bit for bit."""

import pytest
import torch
import transformers

import weightplan
from weightplan.errors import ArgumentError, ParallelError

from tests.parallel.conftest import JOBS, PRETRAINED_JOBS
from tests.parallel.tp_load_worker import PROMPT

CASES = [(n, how, world) for world, jobs in PRETRAINED_JOBS.items() for how, names in jobs
         for n in names]


def single_process_logits(directory):
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return reference(PROMPT).logits


@pytest.mark.parametrize("fixture, how, world", CASES)
def test_the_returned_model_runs_and_equals_one_process(tp_checkpoints, tp_pretrained, fixture,
                                                        how, world):
    want = single_process_logits(tp_checkpoints[fixture])
    for rank in range(world):
        got = torch.load(tp_pretrained / f"{fixture}.{how}{world}.rank{rank}.pt")
        assert got["__group_before__"] is False  # weightplan started it from the environment
        assert got["__logits__"].shape == want.shape
        assert (got["__logits__"] - want).abs().max().item() <= 1e-5, (rank, fixture)


ORACLE = {(n, how, world) for world, jobs in JOBS.items() for how, names in jobs
          for n in (names or [c[0] for c in CASES])}


@pytest.mark.parametrize("fixture, how, world", [c for c in CASES if c in ORACLE])
def test_every_rank_holds_what_transformers_gives_it(tp_oracle, tp_pretrained, fixture, how,
                                                     world):
    for rank in range(world):
        ours = torch.load(tp_pretrained / f"{fixture}.{how}{world}.rank{rank}.pt")
        theirs = tp_oracle.rank(fixture, how, world, rank)
        assert theirs.keys() <= ours.keys()
        for name, (local, placements) in theirs.items():
            mine, my_placements = ours[name]
            assert my_placements == placements, name
            assert torch.equal(mine, local), name


def test_without_torchrun_the_error_says_how_to_run_it(tp_checkpoints, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ParallelError, match="run under torchrun"):
        weightplan.from_pretrained(tp_checkpoints["llama"], tp="auto")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ParallelError, match="torchrun's WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
                                            "not set"):
        weightplan.from_pretrained(tp_checkpoints["llama"], tp="auto")


def test_tp_that_cannot_give_a_running_model_is_refused(tp_checkpoints):
    directory = tp_checkpoints["llama"]
    with pytest.raises(ParallelError, match="world_size=/rank= plan one rank offline"):
        weightplan.from_pretrained(directory, tp=weightplan.TensorParallel(world_size=2, rank=0))
    with pytest.raises(ParallelError, match="needs output='dtensor'"):
        weightplan.from_pretrained(directory, tp=weightplan.TensorParallel(output="local"))
    with pytest.raises(ArgumentError, match="drop device_map"):
        weightplan.from_pretrained(directory, tp="auto", device_map="cpu")


def test_heads_that_do_not_split_over_the_ranks_are_refused(tp_pretrained):
    for rank in range(4):
        message = torch.load(tp_pretrained / f"refused.rank{rank}.pt")
        assert message.startswith("ParallelError: LlamaForCausalLM: num_key_value_heads=2 "
                                  "doesn't split over 4 ranks"), message
