"""Issue 21 item 11: Ctrl-C during a non-atomic load into allocated tensors says which
tensors it overwrote.

A real SIGINT from another process, while the child's load waits inside a read: the
KeyboardInterrupt stays a KeyboardInterrupt, and carries a note and ``.overwritten``
listing every tensor that received bytes (as PartialLoadError does for failures), and no
other tensor changed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("threads", [0, 2])
def test_sigint_during_an_in_place_load_reports_what_it_overwrote(tmp_path, threads):
    path = tmp_path / "model.safetensors"
    save_file({f"t{i}": torch.randn(64, 1024) for i in range(8)}, str(path))
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
    child = subprocess.Popen([sys.executable, str(HERE / "sigint_child.py"), str(path),
                              str(threads)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    report = json.loads(out)
    assert report["outcome"] == "interrupted"
    assert report["changed"] and set(report["changed"]) <= set(report["overwritten"])
    if threads == 0:  # interrupted inside the fourth read: the later ones never ran
        assert len(report["changed"]) < 8
    (note,) = report["notes"]
    assert "interrupted after overwriting" in note and "atomic=True" in note
    assert all(key in note for key in report["overwritten"])
