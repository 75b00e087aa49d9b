"""Draw the README's pictures from a real plan (nothing in docs/ is drawn by hand).

    python scripts/readme_pictures.py          # writes docs/plan.svg and docs/timeline.svg

The plan is the demo's (``weightplan demo``): a 4-layer, 8-expert Mixtral-style model
whose checkpoint is written in the legacy per-expert layout as two shards, explained
with a 3.5 MiB budget so the timeline shows a budget line. Needs graphviz's ``dot``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # draw with this checkout's weightplan, not another install

import torch  # noqa: E402

import weightplan  # noqa: E402
from weightplan.demo import TinyMoE, TinyMoEConfig, legacy_state_dict, write_sharded  # noqa: E402
from weightplan.viz.dot import find_dot  # noqa: E402

DOCS = ROOT / "docs"
BUDGET = "3.5MiB"


def demo_plan(directory: Path) -> weightplan.Plan:
    """Write the demo checkpoint into ``directory`` and explain loading it."""
    torch.manual_seed(0)
    cfg = TinyMoEConfig()
    write_sharded(legacy_state_dict(TinyMoE(cfg)), directory)
    with weightplan.init_empty():
        model = TinyMoE(cfg)
    return weightplan.explain(model, directory, budget=BUDGET)


def main(out: Path = DOCS) -> int:
    if find_dot() is None:
        print("graphviz's `dot` is needed to draw docs/plan.svg (apt install graphviz)",
              file=sys.stderr)
        return 1
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "demo-checkpoint"  # a fixed name: it is the pictures' title
        ckpt.mkdir()
        plan = demo_plan(ckpt)
        print(plan.render(out / "plan.svg"))
        print(plan.render_timeline(out / "timeline.svg"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
