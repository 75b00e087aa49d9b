"""torchrun worker: keep-quantized loads under tensor parallel on a real gloo group.

    torchrun --nproc-per-node N tests/quant/keep_tp_worker.py OUT DIR...

Each checkpoint directory (a packed format's) is loaded into a meta model holding its
stored tensors under their names and dtypes (keep-quantized), with
``TensorParallel(plan=RULES)`` on the default group (``DTensor`` parameters); each rank
dumps ``{name: (local tensor, placements)}`` to ``OUT/<dir name>.keep<N>.rank<r>.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import weightplan
from tests.hostile.helpers import meta_model
from tests.parallel.tp_oracle_worker import local_part

# column-parallel q/gate/up (split `out`), row-parallel o/down (split `in`)
RULES = {"model.layers.*.self_attn.q_proj": "colwise",
         "model.layers.*.self_attn.o_proj": "rowwise",
         "model.layers.*.mlp.experts.*.gate_proj": "colwise",
         "model.layers.*.mlp.experts.*.up_proj": "colwise",
         "model.layers.*.mlp.experts.*.down_proj": "rowwise"}


def stored_model(directory: Path) -> torch.nn.Module:
    """A module with a meta parameter per stored tensor (its name, shape and dtype)."""
    return meta_model({name: value for f in sorted(directory.glob("*.safetensors"))
                       for name, value in load_file(str(f)).items()})


def main() -> None:
    out_dir, *dirs = sys.argv[1:]
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    dist.init_process_group("gloo")
    for directory in map(Path, dirs):
        model = stored_model(directory)
        plan = weightplan.explain(model, directory, tp=weightplan.TensorParallel(plan=RULES))
        assert not plan.problems, str(plan)
        assert "kept as stored" in str(plan).splitlines()[0], str(plan)
        plan.execute()
        record = {n: local_part(p.data) for n, p in model.named_parameters()}
        torch.save(record, Path(out_dir) / f"{directory.name}.keep{world}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
