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
from weightplan.convert import convert, revert
from weightplan.errors import WeightplanError
from weightplan.executor.report import LoadReport, SaveReport
from weightplan.meta import init_empty
from weightplan.planner.keys import mappings as _mappings
from weightplan.planner.keys.registry import REGISTRY, get_mapping, register_alias, register_mapping
from weightplan.planner.keys.transforms import PrefixChange, WeightConverter, WeightRenaming

_mappings.register_builtins(REGISTRY)

__version__ = "0.1.0"


def load(model: torch.nn.Module, checkpoint: object, *, strict: bool = False,
         progress: bool | None = None, **kwargs: Any) -> LoadReport:
    """``explain(model, checkpoint, **kwargs).execute(strict=..., progress=...)``."""
    return explain(model, checkpoint, **kwargs).execute(strict=strict, progress=progress)


def save(model: torch.nn.Module, directory: str | os.PathLike[str], *, mapping: object = None,
         max_shard_size: int | str = "5GB", overwrite: bool = False, threads: int = 4,
         progress: bool | None = None, quantize: str | None = None) -> SaveReport:
    """Write ``model`` to ``directory`` in its checkpoint's original layout.

    ``explain_save(model, directory, ...).execute(progress=...)``: a model loaded by
    weightplan is written back exactly as its checkpoint was (keys, shapes, dtypes,
    bytes); any other model through the inverse of its mapping. ``quantize="fp8"``
    writes block FP8 with ``weight_scale_inv`` where the model was dequantized.
    """
    plan = explain_save(model, directory, mapping=mapping, max_shard_size=max_shard_size,
                        overwrite=overwrite, threads=threads, quantize=quantize)
    return plan.execute(progress=progress)


__all__ = [
    "explain", "load", "save", "convert", "revert", "explain_save", "explain_convert",
    "Plan", "WritePlan", "LoadReport", "SaveReport",
    "WeightRenaming", "PrefixChange", "WeightConverter",
    "register_mapping", "get_mapping", "register_alias", "init_empty", "WeightplanError",
]
