"""torchrun worker: transformers' own TP/EP load of each fixture, dumped per rank.

    torchrun --nproc-per-node N tests/parallel/tp_oracle_worker.py OUT MODE:DIR...

MODE is ``tp`` (``tp_plan="auto"``) or ``ep`` (``DistributedConfig(tp_size=N, ep_size=N)``);
one launch runs every job (starting processes is what costs).
Writes ``OUT/<fixture>.<mode><N>.rank<r>.pt``: ``{param: (local tensor, placements or None)}``,
a placement as ``(class name, dim, split_factor)``.
transformers sets up the gloo group itself from torchrun's environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

def distributed_kwargs(mode: str, world: int) -> dict:
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:  # older 5.x
        from transformers import DistributedConfig
    if mode == "ep":
        return {"distributed_config": DistributedConfig(tp_size=world, ep_size=world)}
    return {"distributed_config": DistributedConfig(tp_plan="auto")}


def local_part(data: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
    """A parameter's local tensor (a copy) and its DTensor placements (``None``: plain)."""
    if not hasattr(data, "to_local"):
        return data.detach().clone(), None
    placements = tuple((type(p).__name__, getattr(p, "dim", None),
                        getattr(p, "split_factor", None)) for p in data.placements)
    return data.to_local().detach().clone(), placements


def dump(model) -> dict:
    return {name: local_part(param.data) for name, param in model.named_parameters()}


def main() -> None:
    out_dir, *jobs = sys.argv[1:]
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    for job in jobs:
        mode, _, directory = job.partition(":")
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                     **distributed_kwargs(mode, world))
        record = dump(model)
        name = Path(directory).name
        torch.save(record, Path(out_dir) / f"{name}.{mode}{world}.rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
