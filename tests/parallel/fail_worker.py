"""torchrun worker: a cooperative load where one rank's checkpoint copy is broken.

    torchrun --nproc-per-node 2 tests/parallel/fail_worker.py OUT DIR

Every rank loads its own copy of ``DIR`` (``OUT/rank<r>``, as when each node has a copy)
cooperatively, on a group whose timeout is short (a rank left waiting fails the
test instead of hanging it):

- ``plan``: rank 1's copy has a corrupt header, so its ``explain`` fails;
- ``read``: every rank plans, then rank 1's copy is cut short before ``execute``;
- ``build``: ``from_pretrained(tp=TensorParallel(cooperative=True))`` where rank 1's copy is
  missing: it fails before planning, after the process group runs;
- ``die`` (last: it ends the group): rank 1 leaves the process (exit status 0) when the
  broadcasts start, after the ranks agreed that every read succeeded.

Each rank writes ``OUT/<scenario>.rank<r>.json``: the error it raised (``type``,
``message``, ``failures`` for a :class:`~weightplan.errors.RankFailedError`), or none.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

import weightplan
from weightplan.errors import RankFailedError

BROKEN = 1


def load(directory: Path, before_execute=None) -> None:
    with weightplan.init_empty():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory),
                                                 dtype=torch.bfloat16)
    tp = weightplan.TensorParallel(output="local", cooperative=True)
    plan = weightplan.explain(model, directory, dtype=torch.bfloat16, tp=tp)
    if before_execute is not None:
        before_execute()
    plan.execute()


def pretrained(directory: Path) -> None:
    weightplan.from_pretrained(directory, tp=weightplan.TensorParallel(cooperative=True),
                               progress=False)


def dies_at_the_broadcasts() -> None:
    """This process exits when its broadcasts start (the peer sees its sockets close)."""
    from weightplan.executor.exchange import ExchangeSink

    def broadcast(self):
        os._exit(0)

    ExchangeSink.broadcast = broadcast


def outcome(fn) -> dict:
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e),
                "failures": getattr(e, "failures", None) if isinstance(e, RankFailedError)
                else None}
    return {"type": None}


def largest(directory: Path) -> Path:
    return max(directory.glob("*.safetensors"), key=lambda p: p.stat().st_size)


def main() -> None:
    out, source = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    mine = out / f"rank{rank}"
    for scenario in ("plan", "read", "build"):
        shutil.rmtree(mine, ignore_errors=True)
        shutil.copytree(source, mine)
        dist.barrier()
        broken = largest(mine)
        if scenario == "plan" and rank == BROKEN:
            with open(broken, "r+b") as f:
                f.write(b"\xff" * 8)  # a header length past the end of the file
        cut = functools.partial(os.truncate, broken, broken.stat().st_size // 2) \
            if scenario == "read" and rank == BROKEN else None
        if scenario == "build" and rank == BROKEN:
            shutil.rmtree(mine)
        run = functools.partial(pretrained, mine) if scenario == "build" else \
            functools.partial(load, mine, cut)
        result = outcome(run)
        (out / f"{scenario}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    shutil.rmtree(mine, ignore_errors=True)
    shutil.copytree(source, mine)
    dist.barrier()
    if rank == BROKEN:
        dies_at_the_broadcasts()
    result = outcome(functools.partial(load, mine))
    (out / f"die.rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # (the group is broken: no barrier, no destroy)


if __name__ == "__main__":
    main()
