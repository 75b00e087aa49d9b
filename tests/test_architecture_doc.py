"""ARCHITECTURE.md stays true: short, every module it names exists, every floor drawn."""

import re
from pathlib import Path

from tests.test_layers import FLOORS

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "ARCHITECTURE.md").read_text()
FILES = [p.relative_to(ROOT / "weightplan").as_posix() for p in (ROOT / "weightplan").rglob("*.py")]


def test_it_is_short():
    assert len(DOC.splitlines()) <= 150


def test_every_module_it_names_exists():
    named = set(re.findall(r"([\w/]+\.py)\b", DOC))
    assert named, "the map names modules"
    missing = sorted(n for n in named if not (ROOT / n).is_file()
                     and not any(f == n or f.endswith("/" + n) for f in FILES))
    assert missing == []


def test_every_floor_is_on_the_map():
    for _, prefixes in FLOORS:
        for prefix in prefixes:
            parts = prefix.split(".")[1:]
            if parts and (ROOT / "weightplan" / Path(*parts)).is_dir():
                assert "/".join(parts[-1:]) + "/" in DOC, prefix
