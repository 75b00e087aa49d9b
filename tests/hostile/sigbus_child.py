"""Child process for test_sigbus: load a checkpoint, pausing inside the second read until
another process truncates the file (or 10 s pass).

    python sigbus_child.py PATH [main|thread] [direct|cast]

``main``: execute() in the main thread (the file is leased: the truncation waits for the
window in flight). ``thread``: execute() in a worker thread, as servers and GUIs do (no
lease can be taken there: the file must not be mapped at all). ``cast`` loads in float64,
so every read goes through a window and a strided copy instead of straight into place.
"""

import contextlib
import os
import sys
import threading
import time

import torch

import weightplan
from weightplan.executor import reader as reader_mod

from helpers import meta_model  # noqa: E402  (run as a script from this directory)

path = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "main"
cast = len(sys.argv) > 3 and sys.argv[3] == "cast"
like = {f"t{i}": torch.zeros(64, 1024) for i in range(8)}
plan = weightplan.explain(meta_model(like), path, threads=0,
                          dtype=torch.float64 if cast else None)
original_window, original_read_into = reader_mod.Reader.window, reader_mod.Reader.read_into
count = [0]
size = os.stat(path).st_size


def pause(reader) -> None:
    """At the second read: say so, then wait for the truncation (or the lease's break)."""
    count[0] += 1
    if count[0] != 2:
        return
    print("ready", flush=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not reader._lease._broken \
            and os.stat(path).st_size == size:
        time.sleep(0.01)


@contextlib.contextmanager
def window(self, *args):
    with original_window(self, *args) as view:
        pause(self)
        yield view  # the caller copies out of it now


def read_into(self, *args):
    pause(self)
    return original_read_into(self, *args)


reader_mod.Reader.window = window
reader_mod.Reader.read_into = read_into
outcome = []


def load() -> None:
    try:
        plan.execute(progress=False)
        outcome.append("loaded")
    except weightplan.WeightplanError as e:
        outcome.append(f"typed {type(e).__name__}: {e}")


if mode == "thread":
    worker = threading.Thread(target=load)
    worker.start()
    worker.join()
else:
    load()
print(outcome[0], flush=True)
