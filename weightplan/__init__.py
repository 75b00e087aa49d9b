"""weightplan: load model checkpoints into PyTorch models by an explicit, inspectable plan.

    plan = weightplan.explain(model, "ckpt_dir/")   # headers only, no tensor bytes
    print(plan)                                      # what will happen, before it happens
    report = plan.execute()                          # load
"""

from __future__ import annotations

import os
from typing import Any

import torch

from weightplan.api.entry import explain, explain_convert, explain_save
from weightplan.api.plans import Plan, WritePlan
from weightplan import guard as _guard
from weightplan.convert import convert, revert
from weightplan.errors import WeightplanError
from weightplan.executor.report import LoadReport, SaveReport
from weightplan.meta import init_empty
from weightplan.model_config import write_model_config
from weightplan.pretrained import from_pretrained
from weightplan.planner.tensors.sharding.config import TensorParallel
from weightplan.planner.keys import mappings as _mappings
from weightplan.planner.keys.registry import REGISTRY, get_mapping, register_alias, register_mapping
from weightplan.planner.keys.transforms import PrefixChange, WeightConverter, WeightRenaming

_mappings.register_builtins(REGISTRY)

__version__ = "0.1.0"


def load(model: torch.nn.Module, checkpoint: object, *, strict: bool = False,
         progress: bool | None = None, atomic: bool = False, **kwargs: Any) -> LoadReport:
    """``explain(model, checkpoint, **kwargs).execute(strict=..., progress=..., atomic=...)``."""
    return explain(model, checkpoint, **kwargs).execute(strict=strict, progress=progress,
                                                        atomic=atomic)


def save(model: torch.nn.Module, directory: str | os.PathLike[str], *, mapping: object = None,
         max_shard_size: int | str = "5GB", overwrite: bool = False, threads: int = 4,
         progress: bool | None = None, quantize: str | None = None) -> SaveReport:
    """Write ``model`` to ``directory`` in its checkpoint's original layout.

    ``explain_save(model, directory, ...).execute(progress=...)``: a model loaded by
    weightplan is written back exactly as its checkpoint was (keys, shapes, dtypes,
    bytes); any other model through the inverse of its mapping (prefix changes left out,
    as transformers does). ``quantize="fp8"`` writes block FP8 with ``weight_scale_inv``
    where the model was dequantized. A transformers model's ``config.json`` (and
    generation config) is written too, so ``from_pretrained(directory)`` gives the model
    back.
    """
    plan = explain_save(model, directory, mapping=mapping, max_shard_size=max_shard_size,
                        overwrite=overwrite, threads=threads, quantize=quantize)
    report = plan.execute(progress=progress)
    write_model_config(model, directory, fp8_written=plan.writes_fp8)
    return report


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
    "from_pretrained",
    "TensorParallel",
]
