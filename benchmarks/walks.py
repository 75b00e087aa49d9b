"""How far a load walks through weightplan (issue 20's two walk bounds), by tracing calls.

- *the demo's walk*: files of the package whose code runs during the demo's
  ``explain()`` + ``execute()`` (issue 20: fewer than 67, the count before the planner
  was reorganised), and the ``weightplan.*`` modules imported by then;
- *a key's walk*: files whose functions are called with one key among their arguments
  (its text, or an object whose ``key`` / ``name`` / ``label`` / ``entry`` / ``node`` /
  ``targets`` holds it, directly or in a short tuple), loading a two-tensor checkpoint
  (issue 20: fewer than 29 files).

    python benchmarks/walks.py [-v] [--root TREE]

``--root`` measures another checkout's ``weightplan`` (e.g. the code before a change).
Counts, not times: the machine's load doesn't change them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

KEY = "proj.weight"
_HOLDERS = ("key", "name", "label", "entry", "node", "targets")


def _traced(pkg: str, keep: Callable[[FrameType], bool], run: Callable[[], None]) -> set[str]:
    """Files under ``pkg`` with a call ``keep`` accepts while ``run`` runs."""
    files: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(pkg) and keep(frame):
            files.add(os.path.relpath(frame.f_code.co_filename, pkg))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return files


def _holds(value: object, depth: int = 0) -> bool:
    """Whether ``value`` is the key, or holds it within two steps."""
    if isinstance(value, str):
        return value == KEY
    if depth >= 2 or isinstance(value, type):
        return False
    for name in _HOLDERS:
        try:
            inner = getattr(value, name, None)
        except Exception:  # (a property that can't answer: not a holder)
            inner = None
        if inner is not None and inner is not value and _holds(inner, depth + 1):
            return True
    return isinstance(value, (tuple, list)) and len(value) <= 4 and \
        any(_holds(x, depth + 1) for x in value)


def _with_key(frame: FrameType) -> bool:
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return any(_holds(frame.f_locals.get(n)) for n in names)


def demo_walk(pkg: str) -> tuple[set[str], set[str]]:
    """(files run, modules imported) of the demo's explain + execute."""
    import torch

    import weightplan
    from weightplan import demo

    cfg = demo.TinyMoEConfig()
    torch.manual_seed(0)
    ckpt = Path(tempfile.mkdtemp())
    demo.write_sharded(demo.legacy_state_dict(demo.TinyMoE(cfg)), ckpt)
    with weightplan.init_empty():
        model = demo.TinyMoE(cfg)

    def run() -> None:
        weightplan.explain(model, ckpt).execute(progress=False)

    files = _traced(pkg, lambda frame: True, run)
    return files, {m for m in sys.modules if m.startswith("weightplan")}


def key_walk(pkg: str) -> set[str]:
    """Files a key's walk visits (after a first load, so imports don't count)."""
    import torch
    from safetensors.torch import save_file
    from torch import nn

    import weightplan

    d = tempfile.mkdtemp()
    save_file({KEY: torch.randn(4, 4), "other.weight": torch.randn(4, 4)},
              os.path.join(d, "model.safetensors"))

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4, bias=False)
            self.other = nn.Linear(4, 4, bias=False)

    def load() -> None:
        with weightplan.init_empty():
            model = Two()
        weightplan.explain(model, d).execute(progress=False)

    load()
    return _traced(pkg, _with_key, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("-v", action="store_true", help="list the files")
    args = parser.parse_args()
    sys.path.insert(0, args.root)
    import torch  # noqa: F401  (as a user of from_pretrained has them imported)
    import transformers  # noqa: F401

    pkg = os.path.join(args.root, "weightplan")
    files, modules = demo_walk(pkg)
    print(f"the demo's walk: {len(files)} files run (issue 20: fewer than 67), "
          f"{len(modules)} weightplan modules imported")
    walked = key_walk(pkg)
    print(f"a key's walk: {len(walked)} files (issue 20: fewer than 29)")
    if args.v:
        print("demo:", " ".join(sorted(files)))
        print("key:", " ".join(sorted(walked)))


if __name__ == "__main__":
    main()
