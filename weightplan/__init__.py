"""weightplan: load model checkpoints into PyTorch models by an explicit, inspectable plan.

    plan = weightplan.explain(model, "ckpt_dir/")   # headers only, no tensor bytes
    print(plan)                                      # what will happen, before it happens
    report = plan.execute()                          # load
"""

from __future__ import annotations

from weightplan.convert import convert
from weightplan.errors import WeightplanError
from weightplan.executor import run as _run  # imported up front: not inside the first load
from weightplan.executor.report import LoadReport
from weightplan.meta import init_empty
from weightplan.planner import mappings as _mappings
from weightplan.planner.explain import explain
from weightplan.planner.plan import Plan
from weightplan.planner.registry import REGISTRY, get_mapping, register_alias, register_mapping
from weightplan.planner.transforms import PrefixChange, WeightConverter, WeightRenaming

_mappings.register_builtins(REGISTRY)

__version__ = "0.1.0"


def load(model, checkpoint, *, strict: bool = False, progress: bool | None = None, **kwargs
         ) -> LoadReport:
    """``explain(model, checkpoint, **kwargs).execute(strict=..., progress=...)``."""
    return explain(model, checkpoint, **kwargs).execute(strict=strict, progress=progress)


__all__ = [
    "explain", "load", "convert", "Plan", "LoadReport",
    "WeightRenaming", "PrefixChange", "WeightConverter",
    "register_mapping", "get_mapping", "register_alias", "init_empty", "WeightplanError",
]
