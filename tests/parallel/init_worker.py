"""torchrun worker: ``from_pretrained(dir, tp="auto")`` of a checkpoint missing tensors.

    torchrun --nproc-per-node 2 tests/parallel/init_worker.py OUT DIR

The missing tensors get the model's own init on every rank. Each rank saves
``OUT/rank<r>.pt``: ``{"initialized": report.initialized, "tensors": {name: this rank's
tensor (local part of a DTensor), is it sharded}, "logits": the model's on a fixed prompt}``
for every initialized tensor (the forward runs across the ranks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import weightplan

if __package__:
    from .tp_load_worker import PROMPT
else:
    from tp_load_worker import PROMPT


def main() -> None:
    out, directory = Path(sys.argv[1]), sys.argv[2]
    model, report = weightplan.from_pretrained(directory, tp="auto", progress=False,
                                               return_report=True)
    tensors = {}
    for name in report.initialized:
        data = model.get_parameter(name).data
        sharded = hasattr(data, "placements") and any(p.is_shard() for p in data.placements)
        local = data.to_local() if hasattr(data, "to_local") else data
        tensors[name] = (local.detach().clone(), sharded)
    with torch.no_grad():
        logits = model(PROMPT).logits
    torch.save({"initialized": report.initialized, "tensors": tensors, "logits": logits},
               out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
