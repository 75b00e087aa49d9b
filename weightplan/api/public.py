"""The public API, assembled: guarded entry points, ``load`` / ``save``, the built-in
mappings registered. ``weightplan`` re-exports it lazily (see ``weightplan/__init__``), so
a bare ``import weightplan`` (the command line) does not import torch yet."""

from __future__ import annotations

import os
from typing import Any

import torch

from weightplan.api.entry import explain, explain_convert, explain_save
from weightplan.api.plans import Plan, WritePlan
from weightplan.api import guard as _guard
from weightplan.api.convert import convert, revert
from weightplan.errors import WeightplanError  # noqa: F401 (public)
from weightplan.executor.report import LoadReport, SaveReport
from weightplan.meta import init_empty  # noqa: F401 (public)
from weightplan.api.model_config import model_config_files
from weightplan.api.pretrained import from_pretrained
from weightplan.planner.core.sharding.config import TensorParallel  # noqa: F401 (public)
from weightplan.planner.keys.mappings import get_mapping, register_alias, register_mapping
from weightplan.planner.keys.transforms import PrefixChange, WeightConverter, WeightRenaming  # noqa: F401 (public)


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
    generation config) is written too, in the same commit as the shards, so
    ``from_pretrained(directory)`` gives the model back.
    """
    from weightplan.executor.execute_write import execute_write

    plan = explain_save(model, directory, mapping=mapping, max_shard_size=max_shard_size,
                        overwrite=overwrite, threads=threads, quantize=quantize)
    files = model_config_files(model, fp8_written=plan.writes_fp8)
    return execute_write(plan, progress=progress, files=files)


# the public contract: typed arguments in, only WeightplanError out (see weightplan.api.guard)
explain = _guard.public(explain, _guard.check_explain)
from_pretrained = _guard.public(from_pretrained, _guard.check_pretrained)
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
