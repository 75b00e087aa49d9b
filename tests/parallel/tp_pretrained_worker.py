"""torchrun worker: ``weightplan.from_pretrained(dir, tp=...)`` as a user calls it, with no
process group started by the script (weightplan starts it from torchrun's environment).

    torchrun --nproc-per-node N tests/parallel/tp_pretrained_worker.py OUT HOW:DIR...

HOW is ``tp`` (``tp="auto"``), ``ep`` (``TensorParallel(experts="ep")``), ``hand`` (the
README's recipe for a model built by hand: ``prepare_tensor_parallel``, ``load``),
``submesh`` (TP over the ``"tp"`` dimension of a 2-D data × tensor parallel mesh, pairs of
ranks, as ``TensorParallel(mesh=mesh["tp"])``) or ``refused``
(a model that can't run on N ranks: the error goes to ``OUT/refused.rank<r>.pt``). Per job and rank,
``OUT/<fixture>.<how><N>.rank<r>.pt`` holds each parameter's local part and placements, the
logits of the returned model on a fixed prompt (``"__logits__"``, its forward run across
the ranks) and whether a process group ran before the first call (``"__group_before__"``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import weightplan

if __package__:
    from .tp_load_worker import PROMPT
    from .tp_oracle_worker import local_part
else:
    from tp_load_worker import PROMPT
    from tp_oracle_worker import local_part


def by_hand(directory: str) -> torch.nn.Module:
    """The README's recipe for a model built by hand."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from weightplan.parallel import TensorParallel, prepare_tensor_parallel

    tp = TensorParallel()
    with weightplan.init_empty():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory),
                                                 dtype=torch.float32)
    prepare_tensor_parallel(model, tp, tp.ranks().mesh)
    weightplan.load(model, directory, tp=tp)
    return model.eval()


def tp_of(how: str) -> object:
    """The ``tp=`` of a job."""
    if how == "submesh":
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2),
                                mesh_dim_names=("dp", "tp"))
        return weightplan.TensorParallel(mesh=mesh["tp"])
    return "auto" if how == "tp" else weightplan.TensorParallel(experts="ep")


def main() -> None:
    out_dir, *jobs = sys.argv[1:]
    group_before = dist.is_initialized()
    for job in jobs:
        how, _, directory = job.partition(":")
        if how == "refused":  # a plan whose model can't run: the error, on every rank
            try:
                weightplan.from_pretrained(directory, tp="auto", progress=False)
            except weightplan.WeightplanError as e:
                torch.save(f"{type(e).__name__}: {e}", Path(out_dir) / f"refused.rank"
                           f"{dist.get_rank()}.pt")
            continue
        if how == "hand":
            model = by_hand(directory)
        else:
            model = weightplan.from_pretrained(directory, tp=tp_of(how), dtype=torch.float32,
                                               progress=False)
        record = {name: local_part(param.data) for name, param in model.named_parameters()}
        with torch.no_grad():
            record["__logits__"] = model(PROMPT).logits.detach()
        record["__group_before__"] = group_before
        world = int(os.environ["WORLD_SIZE"])
        torch.save(record, Path(out_dir) / f"{Path(directory).name}.{how}{world}"
                   f".rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
