"""The public API, assembled: guarded entry points, ``load`` / ``save``, the built-in
mappings registered. ``weightplan`` re-exports it lazily (see ``weightplan/__init__``), so
a bare ``import weightplan`` (the command line) does not import torch yet. What a load
does not use (the write side's plan type, ``convert`` / ``revert``, ``from_pretrained``,
the reports) is imported here on first use, by :func:`__getattr__`."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import torch

from weightplan.api.entry import explain, explain_convert, explain_save
from weightplan.api.plans import Plan
from weightplan.api import guard as _guard
from weightplan.errors import SaveError, WeightplanError  # noqa: F401 (public)
from weightplan.meta import init_empty  # noqa: F401 (public)
from weightplan.planner.keys.mappings import get_mapping, register_alias, register_mapping
from weightplan.planner.keys.transforms import PrefixChange, WeightConverter, WeightRenaming  # noqa: F401 (public)

if TYPE_CHECKING:
    from weightplan.api.convert import convert, revert  # noqa: F401 (public)
    from weightplan.api.pretrained import from_pretrained  # noqa: F401 (public)
    from weightplan.api.write_plans import WritePlan  # noqa: F401 (public)
    from weightplan.executor.report import LoadReport, SaveReport
    from weightplan.planner.core.sharding.config import TensorParallel  # noqa: F401 (public)

# name → the module that defines it, and its argument check where the name is guarded
_ON_FIRST_USE: dict[str, tuple[str, Any]] = {
    "WritePlan": ("weightplan.api.write_plans", None),
    "LoadReport": ("weightplan.executor.report", None),
    "SaveReport": ("weightplan.executor.report", None),
    "TensorParallel": ("weightplan.planner.core.sharding.config", None),
    "from_pretrained": ("weightplan.api.pretrained", _guard.check_pretrained),
    "convert": ("weightplan.api.convert", _guard.check_tensors),
    "revert": ("weightplan.api.convert", _guard.check_tensors),
}


def __getattr__(name: str) -> Any:
    """A public name a load doesn't use, imported (and guarded) on its first use."""
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, check = _ON_FIRST_USE[name]
    value = getattr(importlib.import_module(module), name)
    if check is not None:
        value = _guard.public(value, check)
    globals()[name] = value  # once: later lookups don't come here
    return value


def load(model: torch.nn.Module, checkpoint: object, *, strict: bool = False,
         progress: bool | None = None, atomic: bool = False, **kwargs: Any) -> LoadReport:
    """``explain(model, checkpoint, **kwargs).execute(strict=..., progress=..., atomic=...)``."""
    _guard.check_forwarded("load", load, explain, kwargs)
    return explain(model, checkpoint, **kwargs).execute(strict=strict, progress=progress,
                                                        atomic=atomic)


def save(model: torch.nn.Module, directory: str | os.PathLike[str], *, mapping: object = None,
         max_shard_size: int | str = "5GB", overwrite: bool = False, threads: int = 4,
         progress: bool | None = None, quantize: str | None = None,
         adapter_name: str | None = None, layout: str | None = None,
         process_group: object = None) -> SaveReport:
    """Write ``model`` to ``directory`` in its checkpoint's original layout.

    ``explain_save(model, directory, ...).execute(progress=...)``: a model loaded by
    weightplan is written back exactly as its checkpoint was (keys, shapes, dtypes,
    bytes); any other model through the inverse of its mapping (prefix changes left out,
    as transformers does). ``quantize="fp8"`` writes block FP8 with ``weight_scale_inv``
    where the model was dequantized. A transformers model's ``config.json`` (and
    generation config) is written too, in the same commit as the shards, so
    ``from_pretrained(directory)`` gives the model back. ``adapter_name``: write only that
    LoRA adapter (loaded by weightplan) as peft's ``adapter_model.safetensors`` +
    ``adapter_config.json``, in the layout its file had (per-expert linears again), or in
    ``layout``: ``"per_expert"`` or ``"fused"`` (bit for bit either way; a fused ``lora_B``
    with values off its diagonal blocks has no per-expert form and is refused by name).

    A tensor-parallel model (``DTensor``s) is saved by the ranks of ``process_group``
    together (a ``ProcessGroup`` or a 1-D ``DeviceMesh``; by default the world): every
    one of them calls ``save``, the group's first rank writes, each returns once the
    files are committed. One data-parallel replica saving alone passes its TP group
    (``process_group=mesh["tp"]``). A model without ``DTensor``s is written by each
    caller, unless ``process_group`` is given (its first rank writes).
    """
    if adapter_name is not None and process_group is not None:
        raise SaveError("process_group= is for a model's save; an adapter (adapter_name=) "
                        "is written by the rank that calls save")
    if adapter_name is not None:
        from weightplan.api.adapters import save_adapter

        return save_adapter(model, directory, adapter_name=adapter_name, overwrite=overwrite,
                            threads=threads, progress=progress, layout=layout)
    if layout is not None:
        raise SaveError("layout= is the layout of an adapter's file: pass adapter_name= too")
    from weightplan.api.model_config import model_config_files
    from weightplan.executor.execute_write import execute_write

    try:
        plan = explain_save(model, directory, mapping=mapping, max_shard_size=max_shard_size,
                            overwrite=overwrite, threads=threads, quantize=quantize)
        files = model_config_files(model, fp8_written=plan.writes_fp8,
                                   written_dtypes=plan.recorded_dtypes)
    except Exception as e:  # the ranks saving with this one learn it at once
        _tell_plan_failure(model, process_group, e)
        raise
    return execute_write(plan, progress=progress, files=files, process_group=process_group)


def _tell_plan_failure(model: torch.nn.Module, process_group: object,
                       error: Exception) -> None:
    import torch.distributed as dist

    if process_group is None and not (dist.is_available() and dist.is_initialized()):
        return  # (a plain save: nothing to tell, nothing more imported)
    from weightplan.executor.gather import model_has_dtensors, save_group
    from weightplan.executor.save_agreement import tell_plan_failure

    try:
        group = save_group(process_group, model_has_dtensors(model))
    except Exception:
        return  # (no group to tell: this rank's own error goes on)
    if group is not None:
        tell_plan_failure(group, error)


# the public contract: typed arguments in, only WeightplanError out (see weightplan.api.guard)
explain = _guard.public(explain, _guard.check_explain)
load = _guard.public(load, _guard.check_load)
save = _guard.public(save, _guard.check_save)
explain_save = _guard.public(explain_save, _guard.check_save)
explain_convert = _guard.public(explain_convert, _guard.check_explain_convert)
register_mapping = _guard.public(register_mapping, _guard.check_names)
register_alias = _guard.public(register_alias, _guard.check_names)
get_mapping = _guard.public(get_mapping, _guard.check_names)
_guard.guard_methods(Plan, {"render": _guard.check_path, "render_timeline": _guard.check_path,
                            "to_dict": None})
