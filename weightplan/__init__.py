"""weightplan: load model checkpoints into PyTorch models by an explicit, inspectable plan.

    plan = weightplan.explain(model, "ckpt_dir/")   # headers only, no tensor bytes
    print(plan)                                      # what will happen, before it happens
    report = plan.execute()                          # load
"""

from __future__ import annotations

from weightplan import guard as _guard
from weightplan.convert import convert, revert
from weightplan.errors import WeightplanError
from weightplan.executor import execute_load as _load  # noqa: F401  (imported now: not inside the first load)
from weightplan.executor.report import LoadReport, SaveReport
from weightplan.meta import init_empty
from weightplan.planner.keys import mappings as _mappings
from weightplan.planner.explain import explain
from weightplan.planner.plan import Plan
from weightplan.planner.keys.registry import REGISTRY, get_mapping, register_alias, register_mapping
from weightplan.planner.write.explain_write import explain_convert, explain_save
from weightplan.planner.write.write_plan import WritePlan
from weightplan.planner.keys.transforms import PrefixChange, WeightConverter, WeightRenaming

_mappings.register_builtins(REGISTRY)

__version__ = "0.1.0"


def load(model, checkpoint, *, strict: bool = False, progress: bool | None = None,
         atomic: bool = False, **kwargs) -> LoadReport:
    """``explain(model, checkpoint, **kwargs).execute(strict=..., progress=..., atomic=...)``."""
    return explain(model, checkpoint, **kwargs).execute(strict=strict, progress=progress,
                                                        atomic=atomic)


def save(model, directory, *, mapping=None, max_shard_size: int | str = "5GB",
         overwrite: bool = False, threads: int = 4, progress: bool | None = None) -> SaveReport:
    """Write ``model`` to ``directory`` in its checkpoint's original layout.

    ``explain_save(model, directory, ...).execute(progress=...)``: a model loaded by
    weightplan is written back exactly as its checkpoint was (keys, shapes, dtypes,
    bytes); any other model through the inverse of its mapping.
    """
    plan = explain_save(model, directory, mapping=mapping, max_shard_size=max_shard_size,
                        overwrite=overwrite, threads=threads)
    return plan.execute(progress=progress)


# the public contract: typed arguments in, only WeightplanError out (see weightplan.guard)
explain = _guard.public(explain, _guard.check_explain)
load = _guard.public(load, _guard.check_load)
save = _guard.public(save, _guard.check_save)
explain_save = _guard.public(explain_save, _guard.check_save)
explain_convert = _guard.public(explain_convert, _guard.check_explain_convert)
convert = _guard.public(convert, _guard.check_tensors)
revert = _guard.public(revert, _guard.check_tensors)
register_mapping = _guard.public(register_mapping, _guard.check_names)
register_alias = _guard.public(register_alias, _guard.check_names)
get_mapping = _guard.public(get_mapping, _guard.check_names)
_guard.guard_methods(Plan, {"render": _guard.check_path, "render_timeline": _guard.check_path,
                            "to_dict": None})
_guard.guard_methods(WritePlan, {"to_dict": None})

__all__ = [
    "explain", "load", "save", "convert", "revert", "explain_save", "explain_convert",
    "Plan", "WritePlan", "LoadReport", "SaveReport",
    "WeightRenaming", "PrefixChange", "WeightConverter",
    "register_mapping", "get_mapping", "register_alias", "init_empty", "WeightplanError",
]
