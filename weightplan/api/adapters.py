"""A base checkpoint and a LoRA adapter in one plan: the adapter injected with peft into
the base built on meta, then base and adapter tensors planned and scheduled together."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from weightplan.api.entry import bridge_for, by_name
from weightplan.api.hub import refuse_repo_id
from weightplan.api.plans import Plan, promote
from weightplan.errors import AdapterError, ParallelError, WeightplanError
from weightplan.planner.inputs.adapter import is_adapter_dir, read_adapter
from weightplan.bridge.config_guard import read_directory
from weightplan.planner.inputs.checkpoint import DirectoryRead, open_checkpoint
from weightplan.planner.pipelines.adapter_load import explain_base_and_adapter
from weightplan.planner.pipelines.adapter_merge import explain_merged_load
from weightplan.planner.pipelines.load import choose_mapping


def explain_with_adapter(model: torch.nn.Module,
                         base: str | os.PathLike[str] | Path | DirectoryRead,
                         adapter: str | os.PathLike[str], *, adapter_name: str = "default",
                         mapping: object = None, tp: object = None, merge: bool = False,
                         **options: Any) -> Plan:
    """Inject ``adapter`` into ``model`` (in place, on meta) and plan loading ``base`` and
    the adapter's tensors in one plan; ``merge=True``: the adapter is folded into the base
    weights inside the plan instead (``model`` stays the plain base model; a copy on meta
    gets the injection, to tell where peft puts each factor and its scale).

    Raises:
        AdapterError: ``adapter`` is not an adapter directory, peft is missing or refuses it.
        ParallelError: ``tp=`` (not supported with an adapter yet).
    """
    from weightplan.bridge.peft import inject  # (peft: only when an adapter is asked for)

    if tp is not None:
        raise ParallelError(f"{adapter}: tp= with an adapter is not supported yet; load "
                            "without tp=")
    refuse_repo_id(base, "explain_with_adapter")
    refuse_repo_id(adapter, "explain_with_adapter", adapter=True)
    if not is_adapter_dir(adapter):
        raise AdapterError(f"{adapter}: not an adapter directory (adapter_config.json + "
                           "adapter_model.safetensors)")
    spec = read_adapter(adapter)
    mapping = by_name(mapping)
    choice = choose_mapping(mapping, model, bridge_for(model) if mapping is None else None)
    checkpoint = open_checkpoint(base)  # (its headers: the files, and those it leaves out)
    if merge:
        injected = inject(copy.deepcopy(model), spec, choice.transforms, name=adapter_name)
        return promote(Plan, explain_merged_load(model, injected, checkpoint, spec, choice,
                                                 name=adapter_name, **options))
    inject(model, spec, choice.transforms, name=adapter_name)
    return promote(Plan, explain_base_and_adapter(model, checkpoint, spec, choice,
                                                  name=adapter_name, **options))


def explain_adapter_dir(adapter: str, base: str | None = None, variant: str | None = None,
                        **options: Any) -> Plan:
    """``weightplan explain ADAPTER_DIR [--base BASE] [--merge] [--variant V]``: the base
    (``base``, else the config's ``base_model_name_or_path`` when it is a local path or in
    the Hub cache; ``variant``: its weight variant's files, as ``from_pretrained(BASE,
    variant=..., adapter=...)`` reads them: an adapter's file has none) built on meta, the
    adapter injected, both planned in one plan.

    Raises:
        AdapterError: no base given and the config's can't be found locally.
    """
    from weightplan.api.hub import resolve_checkpoint
    from weightplan.bridge.hub import build_empty_model

    if base is not None and is_adapter_dir(base) and not is_adapter_dir(adapter):
        raise AdapterError(f"{base}: --base is an adapter directory and {adapter} is not: "
                           f"swapped? weightplan explain {base} --base {adapter}")
    directory = (adapter_base(adapter, variant) if base is None
                 else resolve_checkpoint(base, variant=variant))
    read = read_directory(directory, variant)
    model = build_empty_model(directory, config_json=read.config).model
    return explain_with_adapter(model, read, adapter, **options)


def save_adapter(model: torch.nn.Module, directory: str | os.PathLike[str], *,
                 adapter_name: str = "default", overwrite: bool = False, threads: int = 4,
                 progress: bool | None = None, layout: str | None = None) -> Any:
    """``save(model, directory, adapter_name=...)``: the adapter's file and config back, in
    the layout it was loaded from (see :mod:`weightplan.planner.pipelines.adapter_save`),
    or in ``layout`` (``"per_expert"`` / ``"fused"``,
    :mod:`weightplan.planner.pipelines.adapter_layout`), its config rewritten to match."""
    from weightplan.executor.execute_write import execute_write
    from weightplan.planner.pipelines.adapter_save import (
        adapter_config_bytes, explain_adapter_save,
    )

    config = adapter_config_bytes(model, adapter_name)
    if layout is None:
        plan = explain_adapter_save(model, directory, name=adapter_name, overwrite=overwrite,
                                    threads=threads)
    else:
        plan, config = _in_layout(model, directory, adapter_name, layout, config,
                                  overwrite=overwrite, threads=threads)
    return execute_write(plan, progress=progress, files={"adapter_config.json": config})


def _in_layout(model: torch.nn.Module, directory: str | os.PathLike[str], name: str,
               layout: str, config_json: bytes, **options: Any) -> tuple[Any, bytes]:
    """The plan writing the adapter in ``layout``, and its config for that layout."""
    import json

    from weightplan.bridge.peft import per_expert_config, rewritten_config
    from weightplan.planner.inputs.adapter import adapter_config_from
    from weightplan.planner.pipelines.adapter_layout import explain_adapter_layout_save

    config = adapter_config_from(json.loads(config_json), f"adapter {name!r}'s config")
    base = choose_mapping(None, model, bridge_for(model))
    plan = explain_adapter_layout_save(model, directory, base, name=name, layout=layout,
                                       modules_to_save=config.modules_to_save, **options)
    raw = (per_expert_config(config, base.transforms) if layout == "per_expert"
           else rewritten_config(config, model, base.transforms))
    return plan, (json.dumps(raw, indent=2, sort_keys=True) + "\n").encode()


def loads_adapter(directory: Path) -> bool:
    """Whether ``from_pretrained(directory)`` loads the adapter its ``adapter_config.json``
    describes, as transformers does: with peft installed, or without a model beside it
    (``config.json``: then it is an error, saying to install peft). A model beside it
    without peft loads alone, as transformers loads it, with a warning."""
    import importlib.util
    import warnings

    if importlib.util.find_spec("peft") is not None or not (directory / "config.json").is_file():
        return True
    warnings.warn(f"{directory}: the adapter beside the model (adapter_config.json) is not "
                  "loaded, as transformers doesn't without peft: pip install "
                  "'weightplan[adapters]' to load it onto the model", UserWarning, stacklevel=6)
    return False


def adapter_base(adapter: str | os.PathLike[str], variant: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The base checkpoint of an adapter: the directory itself where it holds a model too
    (``config.json``: as transformers loads "a local model with an embedded adapter"), else
    the local (or cached, in ``cache_dir``: with ``variant``'s files) one its config names.

    Raises:
        AdapterError: the config names none, or it is neither local nor cached.
    """
    from weightplan.api.hub import resolve_checkpoint

    if (Path(adapter) / "config.json").is_file():
        return Path(adapter)
    spec = read_adapter(adapter)
    if spec.config.base_model is None:
        raise AdapterError(f"{spec.config.file}: no base_model_name_or_path; load it onto its "
                           "base: from_pretrained(BASE, adapter=ADAPTER_DIR), or weightplan "
                           "explain ADAPTER_DIR --base BASE_DIR")
    try:
        return resolve_checkpoint(spec.config.base_model, local_files_only=True, variant=variant,
                                  cache_dir=cache_dir)
    except WeightplanError as e:
        raise AdapterError(f"{adapter}: its base {spec.config.base_model!r} is not here ({e}); "
                           "load it onto its base: from_pretrained(BASE, adapter=ADAPTER_DIR), "
                           "or weightplan explain ADAPTER_DIR --base BASE_DIR") from e
