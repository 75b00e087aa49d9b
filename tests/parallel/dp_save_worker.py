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
- ``planfail``: every rank saves, and rank 3's plan fails (its directory is a file): it
  raises its ``SaveError``, the others a ``RankFailedError`` naming it, at once;
- ``extra``: every rank saves, and rank 2 (of the other replica) holds a parameter the
  others lack: refused on every rank, naming rank 2 and the key;
- ``after``: every rank saves, and rank 1 (the writer's TP peer) fails after its last
  gather: every rank's error says the checkpoint was committed complete;
- ``full``: every rank saves, and the writer's disk fills after its first tensor: the
  writer still takes part in every gather its TP peer waits in, then every rank raises
  (the writer its ``SaveError``, the others a ``RankFailedError`` naming it);
- ``dies`` (last: it breaks the group): every rank saves, and rank 1 (the writer's TP
  peer) leaves after its second gather.

Each rank writes ``OUT/<scenario>.rank<r>.json``: the error it raised (``type``,
``message``, ``committed``), or none, and the report's ``seconds`` (the call's ``took``).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import weightplan
from weightplan.executor import gather, writer
from weightplan.planner.tensors.schedule import machine


def outcome(fn) -> dict:
    started = time.perf_counter()
    try:
        report = fn()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e),
                "committed": getattr(e, "committed", None),
                "took": time.perf_counter() - started}
    return {"type": None, "seconds": getattr(report, "seconds", None)}


def disagreeing(model, rank: int, directory: Path):
    """The save of ``model`` into ``directory`` with a parameter more on ``rank`` (removed
    after)."""
    def call():
        norm = model.model.norm
        if dist.get_rank() == rank:
            norm.register_parameter("extra", torch.nn.Parameter(torch.ones(3)))
        try:
            return weightplan.save(model, directory, progress=False)
        finally:
            norm._parameters.pop("extra", None)

    return call


def fail_commit() -> None:
    """This rank (a writer's TP peer: its sink drops the writes) fails once its gathers
    are done, as its run ends."""
    def commit(self):
        raise OSError("the peer's own failure after its last gather")

    gather.DiscardSink.commit = commit


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
    (out / "blocked").write_text("a file where rank 3 saves")
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
                                              process_group=dist.group.WORLD)),
            ("planfail", save("blocked" if rank == 3 else "planfail")),
            ("extra", disagreeing(model, 2, out / "extra")))
    window = machine.DEFAULT_WINDOW_BYTES
    for scenario, call in plan:
        result = outcome(call)
        (out / f"{scenario}.rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    real_commit = gather.DiscardSink.commit
    if rank == 1:
        fail_commit()
    result = outcome(save("after"))
    (out / f"after.rank{rank}.json").write_text(json.dumps(result))
    gather.DiscardSink.commit = real_commit
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
