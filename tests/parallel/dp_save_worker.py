"""torchrun worker (4 ranks): saving a data × tensor parallel model.

    torchrun --nproc-per-node 4 tests/parallel/dp_save_worker.py OUT SOURCE

The model is loaded with ``TensorParallel(mesh=mesh["tp"])`` on a 2 × 2 (``dp`` × ``tp``)
mesh, on a group whose timeout is short (a rank left waiting fails the test instead of
hanging it). Scenarios, in order, each ending in a barrier of the whole world:

- ``every``: every rank calls ``save(model, DIR)`` (no ``process_group``: the world);
- ``replica1``: only the replica of ``dp`` rank 1 saves (global ranks 2, 3; rank 0 is not
  among them), ``process_group=mesh["tp"]``, while the other replica works on its own
  group (a collective of the world would leave it waiting);
- ``replica0``: the same, the replica of ``dp`` rank 0 (its group passed as a
  ``ProcessGroup``);
- ``narrow``: ranks 0 and 2 save on a group of their own, which lacks rank 1 (where the
  writer's DTensors are sharded too);
- ``plain``: every rank saves a model loaded without ``tp=`` (no DTensors) with
  ``process_group=dist.group.WORLD``: written once, by rank 0;
- ``full``: every rank saves, and the writer's disk fills after its first tensor: the
  writer still takes part in every gather its TP peer waits in, then every rank raises
  (the writer its ``SaveError``, the others a ``RankFailedError`` naming it);
- ``dies`` (last: it breaks the group): every rank saves, and rank 1 (the writer's TP
  peer) leaves after its second gather.

Each rank writes ``OUT/<scenario>.rank<r>.json``: the error it raised (``type``,
``message``), or none, and the report's ``seconds``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import weightplan
from weightplan.executor import gather, writer
from weightplan.planner.tensors.schedule import machine


def outcome(fn) -> dict:
    try:
        report = fn()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e)}
    return {"type": None, "seconds": getattr(report, "seconds", None)}


def leave_after(gathers: int) -> None:
    """This rank exits (status 0: torchrun keeps the others) at its ``gathers + 1``-th gather."""
    real, seen = gather.GatheredTensors.__getitem__, []

    def getitem(self, key):
        seen.append(key)
        if len(seen) > gathers:
            os._exit(0)
        return real(self, key)

    gather.GatheredTensors.__getitem__ = getitem


def fail_writes_after(writes: int) -> None:
    """This rank's file writes fail, after ``writes`` of them, as a full disk's do."""
    from weightplan.errors import SaveError

    real, seen = writer._pwrite_all, []

    def pwrite_all(fd, data, offset, path):
        seen.append(path)
        if len(seen) > writes:
            raise SaveError(f"{path}: write failed at byte {offset}: [Errno 28] No space "
                            "left on device")
        real(fd, data, offset, path)

    writer._pwrite_all = pwrite_all


def main() -> None:
    out, source = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank, tp = mesh["dp"].get_local_rank(), mesh["tp"]
    model = weightplan.from_pretrained(source, tp=weightplan.TensorParallel(mesh=tp),
                                       progress=False)
    pair = dist.new_group([0, 2])  # (every rank creates it)
    whole = weightplan.from_pretrained(source, progress=False)

    def save(name: str, **kwargs):
        return lambda: weightplan.save(model, out / name, progress=False, **kwargs)

    def busy():  # the other replica's own work meanwhile, on its own group
        return lambda: dist.barrier(group=tp.get_group())

    plan = (("every", save("every")),
            ("replica1", save("replica1", process_group=tp) if dp_rank == 1 else busy()),
            ("replica0", save("replica0", process_group=tp.get_group()) if dp_rank == 0
             else busy()),
            ("narrow", save("narrow", process_group=pair) if rank in (0, 2) else lambda: None),
            ("plain", lambda: weightplan.save(whole, out / "plain", progress=False,
                                              process_group=dist.group.WORLD)))
    window = machine.DEFAULT_WINDOW_BYTES
    for scenario, call in plan:
        result = outcome(call)
        (out / f"{scenario}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    real = writer._pwrite_all
    if rank == 0:
        fail_writes_after(2)  # (the shard's header, then the first tensor)
    machine.DEFAULT_WINDOW_BYTES = 1  # (as a model over the read-ahead window: each step
    result = outcome(save("full"))    # finalized, its failure raised, before the next)
    (out / f"full.rank{rank}.json").write_text(json.dumps(result))
    writer._pwrite_all, machine.DEFAULT_WINDOW_BYTES = real, window
    dist.barrier()
    if rank == 1:
        leave_after(2)
    result = outcome(save("dies"))
    (out / f"dies.rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # (the group is broken: no barrier, no destroy)


if __name__ == "__main__":
    main()
