"""torchrun worker: weightplan loads each fixture under TP on a real gloo group.

    torchrun --nproc-per-node N tests/parallel/tp_load_worker.py OUT HOW:DIR...

Per job and rank, a load is dumped to ``OUT/<fixture>.<how><N>.rank<r>.pt``, HOW being:

- ``wp``: a plain meta model, ``TensorParallel()`` on the default group (weightplan's mesh);
- ``ep``: the same with ``experts="ep"`` on a mesh passed as ``mesh=``;
- ``coop`` / ``coopep``: as ``wp`` / ``ep`` (default group), cooperative: each replicated
  tensor read by one rank and broadcast (``"__storage__"``: the bytes this rank requested
  from storage, the checkpoint's bytes, the bytes it sent and received; ``"__spans__"``:
  its reads that request more bytes than they need, see :func:`spans`);
- ``hf``: a model prepared by transformers' own TP utilities (meta ``DTensor`` parameters
  and forward hooks), loaded by ``weightplan.explain(model, dir, tp="auto")``; its logits
  on a fixed prompt go under ``"__logits__"`` (the TP forward runs through transformers).

Each dump also has ``"__bytes__"``: the bytes the executor read and the rank's local bytes.
Then the sharded model is saved (``weightplan.save``) to ``OUT/<fixture>.<how><N>.saved``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoConfig, AutoModelForCausalLM

import weightplan

# the same record of a rank's parameters, from the worker next to this one: as a script
# (torchrun) this file's folder is on sys.path; imported by a test, it is a package module
if __package__:
    from .tp_oracle_worker import local_part
else:
    from tp_oracle_worker import local_part

PROMPT = torch.tensor([[1, 5, 7, 9, 11, 2, 40, 99]])


def meta_model(directory: str):
    config = AutoConfig.from_pretrained(directory)
    with weightplan.init_empty():  # parameters on meta, buffers (rotary) real
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def transformers_prepared(directory: str, world: int):
    from transformers.distributed import DistributedConfig

    model = meta_model(directory)
    config, _, meshes = type(model).prepare_distribute_model(DistributedConfig(tp_size=world))
    return type(model).maybe_distribute_model(model, config, meshes)


def dump(model, report) -> dict:
    out = {name: (*local_part(param.data), tuple(param.data.shape))
           for name, param in model.named_parameters()}
    local = sum(t.numel() * t.element_size() for t, _, _ in out.values())
    out["__bytes__"] = (report.bytes_needed, local)
    return out


def spans(plan) -> list[tuple[str, int, int, int, int, int]]:
    """The reads of a rank's plan that request more than they need: ``(key, bytes
    requested, bytes needed, run bytes, runs, span bytes)``, the runs being the row
    segments the read's region is made of (see weightplan's ``lower/strided.py``)."""
    from weightplan.planner.tensors.lower.strided import byte_runs, span_bytes

    out = []
    for step in plan.schedule.steps:
        for read in step.reads:
            if read.layout.requested > read.needed_bytes:
                spec = read.entry.spec
                runs = byte_runs(tuple(spec.shape), spec.dtype.itemsize, read.region.starts,
                                 read.region.stops)
                out.append((read.entry.key, read.layout.requested, read.needed_bytes,
                            runs.run, runs.count, span_bytes(runs)))
    return out


def _parallel(how: str, world: int):
    if how == "hf":
        return "auto"
    if how == "ep":
        return weightplan.TensorParallel(experts="ep", mesh=init_device_mesh("cpu", (world,)))
    return weightplan.TensorParallel(experts="ep" if how == "coopep" else "tp",
                                     cooperative=how.startswith("coop"))


def main() -> None:
    out_dir, *jobs = sys.argv[1:]
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    dist.init_process_group("gloo")
    for job in jobs:
        how, _, directory = job.partition(":")
        model = transformers_prepared(directory, world) if how == "hf" else meta_model(directory)
        plan = weightplan.explain(model, directory, tp=_parallel(how, world))
        report = plan.execute()
        record = dump(model, report)
        if plan.exchange is not None:
            record["__storage__"] = (report.bytes_read, plan.checkpoint.nbytes,
                                     plan.exchange.network_bytes)
            record["__spans__"] = spans(plan)
        if how == "hf":
            with torch.no_grad():
                record["__logits__"] = model(PROMPT).logits.detach()
        name = f"{Path(directory).name}.{how}{world}"
        torch.save(record, Path(out_dir) / f"{name}.rank{rank}.pt")
        weightplan.save(model, Path(out_dir) / f"{name}.saved")  # gathered, rank 0 writes
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
