"""torchrun worker: a checkpoint storing both names of a declared tie, loaded with ``tp=``.

    torchrun --nproc-per-node 2 tests/parallel/stored_ties_worker.py OUT DIR...

Each DIR (``equal``, ``different``, ``half``: equal in rank 0's rows only) is loaded with
``from_pretrained(DIR, tp="auto")``, and ``equal`` also by the README's recipe for a model
built by hand (transformers' TP utilities prepare it: the plan comes from its DTensors).
Per job and rank, ``OUT/<dir>.<how>.rank<r>.pt`` holds whether ``lm_head.weight`` is
``model.embed_tokens.weight``, the two local shards, the warnings weightplan logged and
the logits of the model on a fixed prompt (its forward run across the ranks). Last,
``equal`` again with rank 1's read failing: ``OUT/fails.rank<r>.json``, the error each
rank raised (the group's timeout is short: a rank left waiting fails the test).
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import weightplan

if __package__:
    from .tp_load_worker import PROMPT
    from .tp_pretrained_worker import by_hand
else:
    from tp_load_worker import PROMPT
    from tp_pretrained_worker import by_hand


class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def local(tensor: torch.Tensor) -> torch.Tensor:
    data = tensor.data
    return (data.to_local() if hasattr(data, "to_local") else data).detach().clone()


def fails_on_rank_1(directory: str) -> dict:
    """``directory`` loaded with ``tp="auto"``, rank 1's reads failing (its copy of the
    file unreadable): what each rank raised."""
    from weightplan.errors import ExecutionError
    from weightplan.executor import execute_load

    real = execute_load.run_plan

    def unreadable(*args, **kwargs):
        raise ExecutionError(f"{directory}/model.safetensors: [Errno 5] Input/output error")

    if dist.get_rank() == 1:
        execute_load.run_plan = unreadable
    try:
        weightplan.from_pretrained(directory, tp="auto", dtype=torch.float32, progress=False)
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e)}
    finally:
        execute_load.run_plan = real
    return {"type": None}


def main() -> None:
    out, *dirs = sys.argv[1:]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    for directory in dirs:
        name = Path(directory).name
        for how in ("tp", "hand") if name == "equal" else ("tp",):
            said = Said()
            logging.getLogger("weightplan").addHandler(said)
            model = (by_hand(directory) if how == "hand" else
                     weightplan.from_pretrained(directory, tp="auto", dtype=torch.float32,
                                                progress=False))
            logging.getLogger("weightplan").removeHandler(said)
            with torch.no_grad():
                logits = model(PROMPT).logits.detach()
            record = {"tied": model.lm_head.weight is model.model.embed_tokens.weight,
                      "head": local(model.lm_head.weight),
                      "embed": local(model.model.embed_tokens.weight),
                      "warned": said.messages, "logits": logits}
            torch.save(record, Path(out) / f"{name}.{how}.rank{dist.get_rank()}.pt")
    result = fails_on_rank_1(next(d for d in dirs if Path(d).name == "equal"))
    (Path(out) / f"fails.rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
