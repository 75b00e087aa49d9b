"""Issue 20's two walk bounds, as ``benchmarks/walks.py`` counts them in a fresh process:
the demo's ``explain()`` + ``execute()`` runs code in fewer than 67 of the package's files,
and one plain key's walk from ``explain`` to its parameter goes through fewer than 29 (a
plain key enters no module of a feature it doesn't have, such as a stack's columns)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_and_a_plain_key_walk_through_few_files():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "walks.py"), "-v"],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    demo = re.search(r"the demo's walk: (\d+) files", out)
    key = re.search(r"a key's walk: (\d+) files", out)
    assert demo is not None and key is not None, out
    assert int(demo.group(1)) < 67, out
    assert int(key.group(1)) < 29, out
    walked = out.split("key:", 1)[1].split()
    assert "planner/tensors/lower/stack_reads.py" not in walked, walked  # (no stack here)
