"""Deliverable 5 and issue 21 item 7: a file truncated by another process during a load
never kills the loader, from the main thread or any other.

The child pauses inside its second read; the parent truncates the file. In the main
thread the read lease (executor/lease.py) holds the truncation until the mapped window is
copied, and the load fails with StaleCheckpointError. In a worker thread no lease can be
taken, so the file is never mapped (executor/reader.py): the truncation is a short read
and a TruncatedCheckpointError (or the fingerprint's StaleCheckpointError). Mapped
without a lease, the child's copy would touch pages past the new end and die of SIGBUS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent


def _truncated_during_load(tmp_path, *mode: str) -> str:
    path = tmp_path / "model.safetensors"
    save_file({f"t{i}": torch.randn(64, 1024) for i in range(8)}, str(path))
    env = dict(os.environ, PYTHONPATH=f"{HERE.parents[1]}{os.pathsep}{HERE}")
    child = subprocess.Popen([sys.executable, str(HERE / "sigbus_child.py"), str(path), *mode],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.truncate(path, 100)  # with a lease: held by the kernel until the window is copied
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, f"the loader died (signal {-child.returncode}): {err}"
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="read leases are Linux-only")
def test_truncation_while_mapped_is_a_typed_error_not_sigbus(tmp_path):
    out = _truncated_during_load(tmp_path, "main")
    assert out.startswith("typed StaleCheckpointError"), out


@pytest.mark.parametrize("reads", ["direct", "cast"])
def test_truncation_during_a_load_in_a_worker_thread_is_a_typed_error(tmp_path, reads):
    out = _truncated_during_load(tmp_path, "thread", reads)
    assert out.startswith(("typed TruncatedCheckpointError", "typed StaleCheckpointError")), out
