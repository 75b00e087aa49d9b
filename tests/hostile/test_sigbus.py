"""Deliverable 5: a file truncated by another process while mapped never kills the loader.

The child pauses inside a mapped window; the parent truncates the file. Without the read
lease (executor/lease.py) the child's copy would touch pages past the new end and die of
SIGBUS; with it the truncation waits until the window is copied, and the load fails with
StaleCheckpointError.
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


@pytest.mark.skipif(sys.platform != "linux", reason="read leases are Linux-only")
def test_truncation_while_mapped_is_a_typed_error_not_sigbus(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({f"t{i}": torch.randn(64, 1024) for i in range(8)}, str(path))
    env = dict(os.environ, PYTHONPATH=f"{HERE.parents[1]}{os.pathsep}{HERE}")
    child = subprocess.Popen([sys.executable, str(HERE / "sigbus_child.py"), str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.truncate(path, 100)  # held by the kernel until the child's window is copied
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, f"the loader died (signal {-child.returncode}): {err}"
    assert out.startswith("typed StaleCheckpointError"), out + err
