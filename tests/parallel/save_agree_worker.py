"""torchrun worker (2 ranks): ranks saving together agree on their plans, and on the end.

    torchrun --nproc-per-node 2 tests/parallel/save_agree_worker.py OUT

Each rank builds the same small model (seeded) and saves it with
``process_group=dist.group.WORLD`` (rank 0 writes), on a group whose timeout is short (a
rank left waiting fails the test instead of hanging it). Scenarios, each ending in a
barrier:

- ``planfail``: rank 1's plan fails (its directory is a file): it raises its
  ``SaveError``, rank 0 a ``RankFailedError`` naming it, at once;
- ``extra``: rank 1's model holds a parameter rank 0's lacks;
- ``shape``: rank 1's ``bias`` has another shape;
- ``after``: rank 1 fails after rank 0 committed the checkpoint;
- ``apart``: the same, each rank saving into a path of its own (per-node paths).

Each rank writes ``OUT/<scenario>.rank<r>.json``: the error it raised (``type``,
``message``, ``committed`` for a ``RankFailedError``) or none, and the call's seconds.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import weightplan
from weightplan.executor import execute_write


def outcome(fn) -> dict:
    started = time.perf_counter()
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e),
                "committed": getattr(e, "committed", None),
                "seconds": time.perf_counter() - started}
    return {"type": None, "seconds": time.perf_counter() - started}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))


def fail_after_the_run() -> None:
    """This rank (it runs nothing: rank 0 writes alone) fails once its run is over."""
    def failing():
        raise OSError("this rank's own failure after the run")

    execute_write.RunStats = failing


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    (out / "blocked").write_text("a file where rank 1 saves")

    def save(name: str, net: torch.nn.Module, directory: str | None = None):
        target = out / (directory or name)
        return lambda: weightplan.save(net, target, progress=False,
                                       process_group=dist.group.WORLD)

    extra, shape = model(), model()
    if rank == 1:
        extra[1].register_parameter("scale", torch.nn.Parameter(torch.ones(3)))
        shape[0].bias = torch.nn.Parameter(torch.zeros(5))
    plan = (("planfail", save("planfail", model(), "blocked" if rank == 1 else None)),
            ("extra", save("extra", extra)), ("shape", save("shape", shape)))
    for scenario, call in plan:
        result = outcome(call)
        (out / f"{scenario}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    if rank == 1:
        fail_after_the_run()
    for scenario, directory in (("after", None), ("apart", "apart" if rank == 0 else "apart1")):
        result = outcome(save(scenario, model(), directory))
        (out / f"{scenario}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
