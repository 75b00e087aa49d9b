"""The package metadata builds without setuptools' deprecations (the license as an SPDX
expression, PEP 639: the ``license = { text = ... }`` table stops building after 2027-02-18)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUILD = """
import sys, warnings
from setuptools import build_meta
out = sys.argv[1]  # setuptools rewrites sys.argv
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = build_meta.prepare_metadata_for_build_wheel(out)
for w in caught:
    print("WARNING", w.category.__name__, str(w.message).splitlines()[0])
print(open(f"{out}/{name}/METADATA").read())
"""


def test_the_license_is_an_spdx_expression_and_nothing_is_deprecated(tmp_path):
    done = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "License-Expression: Apache-2.0" in done.stdout.splitlines()
    warnings = [line for line in done.stdout.splitlines() if line.startswith("WARNING")]
    assert not [w for w in warnings if "Deprecat" in w or "license" in w.lower()], warnings
