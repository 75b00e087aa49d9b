"""weightplan: load model checkpoints into PyTorch models by an explicit, inspectable plan.

    plan = weightplan.explain(model, "ckpt_dir/")   # headers only, no tensor bytes
    print(plan)                                      # what will happen, before it happens
    report = plan.execute()                          # load

The names below are imported on first use (:mod:`weightplan.api.public` assembles them),
so ``import weightplan`` alone imports neither torch nor the planner: the command line
sets itself up before paying for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "explain", "load", "save", "convert", "revert", "explain_save", "explain_convert",
    "Plan", "WritePlan", "LoadReport", "SaveReport",
    "WeightRenaming", "PrefixChange", "WeightConverter",
    "register_mapping", "get_mapping", "register_alias", "init_empty", "WeightplanError",
    "from_pretrained",
    "TensorParallel",
]

if TYPE_CHECKING:
    from weightplan.api.public import (
        LoadReport, Plan, PrefixChange, SaveReport, TensorParallel, WeightConverter,
        WeightplanError, WeightRenaming, WritePlan, convert, explain, explain_convert,
        explain_save, from_pretrained, get_mapping, init_empty, load, register_alias,
        register_mapping, revert, save,
    )


def __getattr__(name: str) -> Any:
    import importlib.util

    if name in __all__:  # (the public API imports what a load doesn't use on first use)
        from weightplan.planner.core.paused_gc import paused_gc

        value = paused_gc(_public)(name)
    elif not name.startswith("_") and importlib.util.find_spec(f"weightplan.{name}") is not None:
        value = importlib.import_module(f"weightplan.{name}")  # a submodule, as before
    else:
        raise AttributeError(f"module 'weightplan' has no attribute {name!r}")
    globals()[name] = value  # once: later lookups don't come here
    return value


def _public(name: str) -> Any:
    """``weightplan.api.public.<name>``. Run with the collector paused: importing makes
    modules, classes and functions, no garbage, and with torch and transformers loaded the
    collections it would trigger cost about a sixth of weightplan's first-use import."""
    import importlib

    module = importlib.import_module("weightplan.api.public")
    made = vars(module)  # (not the names it imports on their first use)
    globals().update({n: made[n] for n in __all__ if n in made})  # the next name: no call
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
