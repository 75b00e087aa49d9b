"""torchrun worker: plain and cooperative TP loads of the strided fixtures on gloo.

    torchrun --nproc-per-node N tests/parallel/coop_worker.py OUT WAYS DIR...

For each checkpoint directory and each of the comma-separated WAYS (``plain``, ``coop``:
cooperative on one shared file system, ``node``: cooperative with the ranks grouped two
per node, each node reading its own copy; ``auto``, ``autocoop``: plain and cooperative by
the model's own plan, whose experts are whole on every rank from transformers 5.25 on, so
that a cooperative load cuts their fused stacks between readers), every rank loads a meta model (bf16; an FP8
checkpoint is dequantized) with ``TensorParallel(output="local", ...)`` on the default
group, by transformers 5.24's plan on any version (``tests.parallel.plans``: each expert
split over the ranks, DeepSeek-V3's MLA attention whole), and dumps
``OUT/<dir>.<way><N>.rank<r>.pt``:
``{"tensors": {name: local tensor}, "bytes_read", "bytes_needed", "checkpoint_bytes",
"network_bytes", "cut"}`` (cut: the tensors read in parts by several ranks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

import weightplan
from tests.parallel.plans import experts_split_plan


NODES = {"local_world_size": 2, "storage": "node"}  # 4 ranks as 2 nodes × 2


def main() -> None:
    out_dir, ways, *directories = sys.argv[1:]
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    dist.init_process_group("gloo")
    for directory in directories:
        for way in ways.split(","):
            with weightplan.init_empty():
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory),
                                                         dtype=torch.bfloat16)
            own = way.startswith("auto")
            tp = weightplan.TensorParallel(output="local", cooperative=way not in ("plain", "auto"),
                                           plan="auto" if own else
                                           experts_split_plan(model, mla_whole=True),
                                           **NODES if way == "node" else {})
            plan = weightplan.explain(model, directory, dtype=torch.bfloat16, tp=tp)
            report = plan.execute()
            record = {"tensors": {n: p.data.clone() for n, p in model.named_parameters()},
                      "bytes_read": report.bytes_read, "bytes_needed": report.bytes_needed,
                      "checkpoint_bytes": plan.checkpoint.nbytes,
                      "network_bytes": 0 if plan.exchange is None else
                      plan.exchange.network_bytes,
                      "cut": [] if plan.exchange is None else sorted(  # (read by several)
                          {i.key for i in plan.exchange.items if i.start})}
            torch.save(record, Path(out_dir) / f"{Path(directory).name}.{way}{world}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
