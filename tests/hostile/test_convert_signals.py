"""``weightplan convert`` stopped by Ctrl-C (SIGINT) or by ``kill`` / ``timeout`` / a CI
runner's cancel (SIGTERM) while its temporaries exist: both remove them and the directory
lock, leave the target as it was, and exit with the status the help text gives (130, 143)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.conftest import moe_checkpoint, write_checkpoint
from tests.hostile.helpers import child_at_ready


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_convert_leaves_nothing_behind(tmp_path, sig, status):
    src = write_checkpoint(tmp_path / "src", moe_checkpoint())
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    with child_at_ready("convert_child.py", src, dst, ready_on="stderr") as child:
        assert any(p.name.endswith(".weightplan-partial") for p in dst.iterdir())
        child.send_signal(sig)
        _, err = child.communicate(timeout=120)
    assert child.returncode == status, err
    assert "weightplan: interrupted" in err
    assert sorted(p.name for p in dst.iterdir()) == ["notes.txt"]


def test_a_sigterm_the_parent_ignores_stays_ignored(tmp_path):
    """A parent that starts the command with SIGTERM ignored (nohup-like) keeps it running,
    as Python leaves an ignored SIGINT ignored; Ctrl-C still stops it (was: 143 at once)."""
    src = write_checkpoint(tmp_path / "src", moe_checkpoint())
    dst = tmp_path / "dst"
    with child_at_ready("convert_child.py", src, dst, ready_on="stderr",
                        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) as child:
        child.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)  # (ignored: still in its pause)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "(SIGTERM)" not in err
