"""Child process for the concurrent-save tests: save a model into a directory, pausing at a
commit step until the parent says go.

    python save_child.py DIR SEED STEP MAX_SHARD

SEED fills tensor i of the model with SEED + i. At STEP ("-": never) it prints
``ready <pid>`` and waits for a line on stdin. It ends printing ``saved``, or ``typed
<ErrorClass>: <message>`` for a weightplan error.
"""

import os
import sys

import torch

import weightplan
from weightplan.executor import commit

try:  # imported by the tests as a package module
    from .helpers import meta_model
except ImportError:  # run as a script from this directory
    from helpers import meta_model  # type: ignore[no-redef]

KEYS = [f"layer{i}.weight" for i in range(6)]


def filled_model(seed: float) -> torch.nn.Module:
    tensors = {k: torch.full((8, 8), seed + i) for i, k in enumerate(KEYS)}
    model = meta_model(tensors)
    for key, value in tensors.items():
        path, attr = key.rsplit(".", 1)
        model.get_submodule(path)._parameters[attr] = torch.nn.Parameter(value,
                                                                         requires_grad=False)
    return model


def main() -> None:
    directory, seed, at, shard = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]

    def pause(step: str) -> None:
        if step == at:
            print(f"ready {os.getpid()}", flush=True)
            sys.stdin.readline()

    commit.STEP_HOOK = pause
    try:
        weightplan.save(filled_model(seed), directory, max_shard_size=int(shard),
                        overwrite=True, threads=0, progress=False)
        print("saved", flush=True)
    except weightplan.WeightplanError as e:
        print(f"typed {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
