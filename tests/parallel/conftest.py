"""transformers' own TP/EP loads as the oracle, run once per test session under torchrun.

Two torchrun launches: 2 ranks (TP for every fixture, EP for the MoE ones) and 4 ranks (TP,
uneven shards: a vocabulary of 102 is 26/26/26/24). Each has a timeout, so a stuck
collective fails the session fixture instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.parallel.tp_fixtures import FOUR_RANKS, MOE, build

WORKER = Path(__file__).with_name("tp_oracle_worker.py")
JOBS = {2: (("tp", None), ("ep", MOE)), 4: (("tp", FOUR_RANKS),)}
TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(world: int, script: Path, *args: str, timeout: int = TIMEOUT_S) -> str:
    """Run ``script`` on ``world`` gloo ranks; returns the output, raises on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), *args]
    path = (str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH"))  # this checkout first
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode:
        raise AssertionError(f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-6000:]}")
    return done.stdout


class Oracle:
    """Per-rank dumps: ``oracle.rank(fixture, mode, world, rank)`` → {param: (local, placements)}."""

    def __init__(self, root: Path, checkpoints: dict[str, Path]):
        self.root, self.checkpoints = root, checkpoints

    def rank(self, fixture: str, mode: str, world: int, rank: int) -> dict:
        return torch.load(self.root / f"{fixture}.{mode}{world}.rank{rank}.pt")


@pytest.fixture(scope="session")
def tp_checkpoints(tmp_path_factory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("tp_checkpoints"))


@pytest.fixture(scope="session")
def tp_oracle(tmp_path_factory, tp_checkpoints) -> Oracle:
    out = tmp_path_factory.mktemp("tp_oracle")
    for world, jobs in JOBS.items():
        args = [f"{mode}:{d}" for mode, names in jobs for n, d in tp_checkpoints.items()
                if names is None or n in names]
        torchrun(world, WORKER, str(out), *args)
    return Oracle(out, tp_checkpoints)


LOADER = Path(__file__).with_name("tp_load_worker.py")
# (how, fixtures) per world size: "hf" loads into transformers' prepared model and runs
# its TP forward; "wp" loads a plain meta model onto weightplan's own mesh; "ep": the same
# with experts="ep" on a mesh given as mesh=; "coop" / "coopep": cooperative loads (TP / EP)
LOAD_JOBS = {2: (("hf", ("llama", "mixtral", "dsv3")), ("wp", ("qwen3moe",)),
                 ("ep", ("qwen3moe",)), ("coop", ("llama", "mixtral", "dsv3")),
                 ("coopep", ("qwen3moe", "dsv3"))),
             4: (("wp", ("mixtral",)), ("coop", ("llama", "mixtral", "llama4kv")))}


@pytest.fixture(scope="session")
def tp_loaded(tmp_path_factory, tp_checkpoints) -> Path:
    """weightplan's own TP loads on real gloo groups of 2 and 4 ranks (dumps per rank)."""
    out = tmp_path_factory.mktemp("tp_loaded")
    for world, jobs in LOAD_JOBS.items():
        args = [f"{how}:{tp_checkpoints[n]}" for how, names in jobs for n in names]
        torchrun(world, LOADER, str(out), *args)
    return out


PRETRAINED = Path(__file__).with_name("tp_pretrained_worker.py")
# from_pretrained(tp=...) as a user runs it: dense and MoE, TP and EP, 2 and 4 ranks, a sub-mesh
PRETRAINED_JOBS = {2: (("tp", ("llama", "llamatied", "qwen3moe", "mixtral", "dsv3")),
                       ("ep", ("qwen3moe", "mixtral", "dsv3")), ("hand", ("mixtral",))),
                   4: (("tp", ("llama4kv", "dsv3")), ("ep", ("dsv3",)),
                       # TP over pairs of a 2 × 2 (data × tensor) mesh: torchrun's
                       # LOCAL_WORLD_SIZE (4) is not the TP world (2)
                       ("submesh", ("mixtral",)))}


@pytest.fixture(scope="session")
def tp_pretrained(tmp_path_factory, tp_checkpoints) -> Path:
    """``from_pretrained(dir, tp=...)`` under torchrun with no process group started first."""
    out = tmp_path_factory.mktemp("tp_pretrained")
    for world, jobs in PRETRAINED_JOBS.items():
        args = [f"{how}:{tp_checkpoints[n]}" for how, names in jobs for n in names]
        if world == 4:  # 2 key/value heads don't split over 4 ranks
            args.append(f"refused:{tp_checkpoints['llama']}")
        torchrun(world, PRETRAINED, str(out), *args)
    return out
