"""Child process for test_sigint: load into allocated tensors (not atomic), wait inside the
fourth read for the parent's SIGINT, then report what the KeyboardInterrupt said and which
tensors really changed.

    python sigint_child.py PATH THREADS
"""

import contextlib
import json
import sys
import time

import torch

import weightplan
from weightplan.executor import reader as reader_mod

path, threads = sys.argv[1], int(sys.argv[2])
model = torch.nn.Module()
for i in range(8):
    model.register_parameter(f"t{i}", torch.nn.Parameter(torch.zeros(64, 1024)))
plan = weightplan.explain(model, path, threads=threads)
original_window, original_read_into = reader_mod.Reader.window, reader_mod.Reader.read_into
count = [0]


def pause() -> None:
    count[0] += 1
    if count[0] == 4:
        print("ready", flush=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the SIGINT arrives here (main thread)
            time.sleep(0.01)


@contextlib.contextmanager
def window(self, *args):
    with original_window(self, *args) as view:
        pause()
        yield view


def read_into(self, *args):
    pause()
    return original_read_into(self, *args)


reader_mod.Reader.window, reader_mod.Reader.read_into = window, read_into
try:
    plan.execute(progress=False)
    report = {"outcome": "loaded"}
except KeyboardInterrupt as e:
    report = {"outcome": "interrupted", "notes": getattr(e, "__notes__", []),
              "overwritten": list(getattr(e, "overwritten", ()))}
changed = [k for k, v in model.state_dict().items() if v.any()]
print(json.dumps({**report, "changed": changed}), flush=True)
