"""Issue 21 item 11: Ctrl-C during a non-atomic load into allocated tensors says which
tensors it overwrote.

A real SIGINT from another process, while the child's load waits inside a read: the
KeyboardInterrupt stays a KeyboardInterrupt, and carries a note and ``.overwritten``
listing every tensor that received bytes (as PartialLoadError does for failures), and no
other tensor changed.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch
from safetensors.torch import save_file

from tests.hostile.helpers import child_at_ready


@pytest.mark.parametrize("threads", [0, 2])
def test_sigint_during_an_in_place_load_reports_what_it_overwrote(tmp_path, threads):
    path = tmp_path / "model.safetensors"
    save_file({f"t{i}": torch.randn(64, 1024) for i in range(8)}, str(path))
    with child_at_ready("sigint_child.py", path, threads) as child:
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    report = json.loads(out)
    assert report["outcome"] == "interrupted"
    assert report["changed"] and set(report["changed"]) <= set(report["overwritten"])
    if threads == 0:  # interrupted inside the fourth read: the later ones never ran
        assert len(report["changed"]) < 8
    (note,) = report["notes"]
    assert "interrupted after overwriting" in note and "atomic=True" in note
    assert all(key in note for key in report["overwritten"])
