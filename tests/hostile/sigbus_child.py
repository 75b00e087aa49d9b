"""Child process for test_sigbus: load a checkpoint, pausing inside the second mapped window
until another process tries to truncate the file (or 10 s pass)."""

import contextlib
import sys
import time

import torch

import weightplan
from weightplan.executor import reader as reader_mod

from helpers import meta_model  # noqa: E402  (run as a script from this directory)

path = sys.argv[1]
like = {f"t{i}": torch.zeros(64, 1024) for i in range(8)}
plan = weightplan.explain(meta_model(like), path, threads=0)
original = reader_mod.Reader.window
count = [0]


@contextlib.contextmanager
def window(self, *args):
    with original(self, *args) as view:
        count[0] += 1
        if count[0] == 2:
            print("ready", flush=True)
            deadline = time.monotonic() + 10
            while not self._lease._broken and time.monotonic() < deadline:
                time.sleep(0.01)
        yield view  # the caller copies out of the mapping now


reader_mod.Reader.window = window
try:
    plan.execute(progress=False)
    print("loaded", flush=True)
except weightplan.WeightplanError as e:
    print(f"typed {type(e).__name__}: {e}", flush=True)
