"""weightplan: load model checkpoints into PyTorch models by an explicit, inspectable plan.

    plan = weightplan.explain(model, "ckpt_dir/")   # headers only, no tensor bytes
    print(plan)                                      # what will happen, before it happens
    report = plan.execute()                          # load
"""

from __future__ import annotations

from weightplan.convert import convert, revert
from weightplan.errors import WeightplanError
from weightplan.executor import execute_load as _load  # noqa: F401  (imported now: not inside the first load)
from weightplan.executor.report import LoadReport, SaveReport
from weightplan.meta import init_empty
from weightplan.model_config import write_model_config
from weightplan.pretrained import from_pretrained
from weightplan.planner.keys import mappings as _mappings
from weightplan.planner.explain import explain
from weightplan.planner.plan import Plan
from weightplan.planner.keys.registry import REGISTRY, get_mapping, register_alias, register_mapping
from weightplan.planner.write.explain_write import explain_convert, explain_save
from weightplan.planner.write.write_plan import WritePlan
from weightplan.planner.keys.transforms import PrefixChange, WeightConverter, WeightRenaming

_mappings.register_builtins(REGISTRY)

__version__ = "0.1.0"


def load(model, checkpoint, *, strict: bool = False, progress: bool | None = None, **kwargs
         ) -> LoadReport:
    """``explain(model, checkpoint, **kwargs).execute(strict=..., progress=...)``."""
    return explain(model, checkpoint, **kwargs).execute(strict=strict, progress=progress)


def save(model, directory, *, mapping=None, max_shard_size: int | str = "5GB",
         overwrite: bool = False, threads: int = 4, progress: bool | None = None) -> SaveReport:
    """Write ``model`` to ``directory`` in its checkpoint's original layout.

    ``explain_save(model, directory, ...).execute(progress=...)``: a model loaded by
    weightplan is written back exactly as its checkpoint was (keys, shapes, dtypes,
    bytes); any other model through the inverse of its mapping (prefix changes left out,
    as transformers does). A transformers model's ``config.json`` (and generation config)
    is written too, so ``from_pretrained(directory)`` gives the model back.
    """
    plan = explain_save(model, directory, mapping=mapping, max_shard_size=max_shard_size,
                        overwrite=overwrite, threads=threads)
    report = plan.execute(progress=progress)
    write_model_config(model, directory)
    return report


__all__ = [
    "explain", "load", "save", "convert", "revert", "explain_save", "explain_convert",
    "Plan", "WritePlan", "LoadReport", "SaveReport",
    "WeightRenaming", "PrefixChange", "WeightConverter",
    "register_mapping", "get_mapping", "register_alias", "init_empty", "WeightplanError",
    "from_pretrained",
]
