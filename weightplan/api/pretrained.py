"""``weightplan.from_pretrained``: a checkpoint directory or Hub repo id → a loaded model.

1. resolve (:mod:`weightplan.api.hub`): a local path as it is; a repo id (``org/name``)
   through the local Hugging Face cache, the Hub only when the cache lacks it;
2. build: the transformers class ``config.json`` names (``model_class=``: an auto class's,
   or that class), on meta (:func:`init_empty`); remote code never runs (nothing is
   imported from the directory: a config's ``auto_map`` is ignored where transformers
   ignores it, refused where it would import the code);
   a quantized checkpoint (block FP8) gets transformers' quantized layers, so its weights
   and scales are kept as they are on disk, as serving deployments keep them
   (:mod:`weightplan.bridge.quantized`), unless ``dequantize=True`` or a ``dtype`` asks for
   a dequantized model;
3. with ``tp=``: start the process group from torchrun's environment when none runs, and
   prepare the model for tensor parallelism with transformers' own utilities
   (:mod:`weightplan.bridge.distribute`), as ``tp_plan="auto"`` does;
4. explain with ``dtype="auto"`` (the config's dtype, else the checkpoint's), execute;
5. like transformers: the model's generation config is read and it is put in eval mode.

``adapter=ADAPTER_DIR`` (a directory or a Hub repo id, resolved as the base's: ``cache_dir``,
``token``, ``local_files_only`` / ``HF_HUB_OFFLINE``, its revision ``adapter_revision=``;
``adapter_name="default"``; a directory holding a model and an adapter, as transformers with
peft: both): a LoRA adapter is injected with peft (the
``adapters`` extra) into the model on meta and loaded with the base in one plan and one
schedule (:mod:`weightplan.api.adapters`); the model keeps its class, as after
transformers' ``load_adapter``; with ``merge=True`` it is folded into the base weights inside
the plan instead (the plain base model, savable in the base checkpoint's layout; an FP8
base is dequantized, and re-quantized only when saved with ``quantize="fp8"``).

transformers' other keywords (``torch_dtype``, ``device_map``, ``trust_remote_code``, ...)
are taken or refused as :mod:`weightplan.api.keywords` says. A status line (on a terminal)
says what is happening until the load's progress bar starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from weightplan.api.hub import resolve_checkpoint
from weightplan.api.keywords import device_from_map, fold_transformers_keywords
from weightplan.api.status import status
from weightplan.errors import ArgumentError, ModelBuildError, ParallelError
from weightplan.bridge.config_guard import read_directory
from weightplan.planner.inputs.checkpoint import DirectoryRead
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.core.sharding.config import TensorParallel, as_tensor_parallel

__all__ = ["from_pretrained", "keeps_quantized", "read_directory", "resolve_checkpoint"]


def from_pretrained(name_or_path: str | os.PathLike[str], *,
                    dtype: torch.dtype | str | None = "auto", device: object = None,
                    device_map: object = None, max_memory: object = None,
                    offload_folder: str | os.PathLike[str] | None = None, tp: object = None,
                    strict: bool = False, progress: bool | None = None,
                    return_report: bool = False, output_loading_info: bool = False,
                    mapping: object = None, budget: int | str | None = None, threads: int = 4,
                    revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None,
                    local_files_only: bool = False, token: str | bool | None = None,
                    subfolder: str | None = None, variant: str | None = None, attn_implementation:
                    str | None = None, experts_implementation: str | None = None, generation_config: Any = None,
                    dequantize: bool | None = None, dequantize_on: str = "auto", model_class: Any = None, adapter:
                    str | os.PathLike[str] | None = None, adapter_name: str = "default", adapter_revision: str | None
                    = None, merge: bool = False, **transformers_only: Any) -> Any:
    """Build the model a checkpoint's ``config.json`` names and load the checkpoint into it.

    Args:
        name_or_path, model_class: a directory or repo id (``"org/name"``); the class built, else config.json's
            (an auto class: ``AutoModelForSequenceClassification``, or a model class of the config).
        dtype: ``"auto"`` (the config's, else the checkpoint's; ``None`` too, as in transformers 5) or a dtype.
        dequantize: whether a quantized checkpoint loads dequantized (:func:`keeps_quantized`).
        device, device_map, max_memory, offload_folder: as :func:`explain` (placed on
            several devices or the disk, the model runs through accelerate's hooks).
        tp: ``"auto"`` or a :class:`TensorParallel`: each rank loads its part of a model prepared as transformers'
            ``tp_plan="auto"`` does (``experts="ep"``: EP), run across the ranks (under torchrun: the group started).
        strict, progress: as :meth:`Plan.execute`; mapping, budget, threads, dequantize_on: as :func:`explain`;
            adapter (a directory or repo id), adapter_name, adapter_revision, merge: see the module.
        return_report / output_loading_info: also return the :class:`LoadReport` / transformers' info;
        revision, cache_dir, local_files_only, token, subfolder, variant, attn_implementation, experts_implementation,
            generation_config, torch_dtype, tp_plan="auto", config overrides (``num_labels=3``): as in :mod:`.keywords`.

    Example:
        >>> model = weightplan.from_pretrained("org/tiny-llama", tp="auto")  # doctest: +SKIP
    """
    _one_return(return_report, output_loading_info, dequantize_on)
    dtype, tp, overrides = fold_transformers_keywords(transformers_only, dtype, _OWN, tp)
    device, keep, (tensor_parallel, mesh) = (device_from_map(device_map, device, _alone(tp, adapter)),
                                             keeps_quantized(dequantize, dtype, tp, merge), _parallel(tp))
    with _agreed(tensor_parallel):  # (a cooperative load's ranks agree here: none waits in vain)
        read, adapter = _resolved(name_or_path, adapter, adapter_revision, revision=revision, cache_dir=cache_dir,
                                  token=token, local_files_only=local_files_only, subfolder=subfolder, variant=variant)
        builds = (attn_implementation, experts_implementation, model_class, transformers_only.get("trust_remote_code"),
                  overrides)
        model = _built(read, tensor_parallel, mesh, builds, progress, (keep, dequantize, dequantize_on), dtype)
    with status(f"planning the load of {read.path}", "planned the load", progress):
        plan = _explain(model, read, adapter, adapter_name, merge, dtype=dtype, mapping=mapping,
                        budget=budget, threads=threads, device=_rank_device(device, mesh), tp=tensor_parallel,
                        max_memory=max_memory, offload_folder=offload_folder, dequantize_on=dequantize_on)
    return _finished(model, read.directory, generation_config, plan.execute(strict=strict, progress=progress),
                     output_loading_info, return_report, plan)


_OWN = tuple(from_pretrained.__code__.co_varnames[
    :from_pretrained.__code__.co_argcount + from_pretrained.__code__.co_kwonlyargcount])


def _finished(model: torch.nn.Module, directory: Path, generation_config: Any, report: Any,
              output_loading_info: bool, return_report: bool, plan: Any) -> Any:
    """Like transformers: the dtype loaded on the config, the generation config read, eval
    mode, the extras asked for."""
    _record_dtype(model, plan.options.dtype)
    _generation_config(_finish_quantized(model).eval(), directory, generation_config)
    extra = loading_info(report, plan.model_info) if output_loading_info else report if return_report else None
    return model if extra is None else (model, extra)


def _record_dtype(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """The dtype loaded, on the model's config and its sub-configs, as transformers sets it
    (``model.config.dtype`` said the config.json's: bfloat16 for a model loaded in float16,
    which code choosing a dtype from the config, and a save of the config, took for it)."""
    config = getattr(model, "config", None)
    if dtype is None or config is None or not hasattr(config, "dtype"):
        return
    config.dtype = dtype
    for key in getattr(config, "sub_configs", None) or ():
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "dtype"):
            sub.dtype = dtype


def _alone(tp: object, adapter: object) -> object:
    """``tp``, refused with an adapter (not supported yet)."""
    if adapter is not None and tp is not None:
        raise ParallelError(f"{adapter}: tp= with an adapter is not supported yet; load "
                            "without tp=")
    return tp


def _resolved(name_or_path: str | os.PathLike[str], adapter: Any, adapter_revision: str | None,
              **hub: Any) -> tuple[DirectoryRead, Any]:
    """The checkpoint with its config read (:func:`read_directory`), and the adapter: an
    adapter directory given loads onto its base, as transformers (with peft) loads it
    (:func:`~weightplan.api.adapters.adapter_base`: the directory's own model, else its config's);
    ``adapter=`` a local directory or a Hub repo id, resolved as the base's is (its cache,
    token, offline switches; ``adapter_revision``: its revision, as peft's ``revision=``)."""
    directory = resolve_checkpoint(name_or_path, **hub)
    if adapter is not None:
        adapter = resolve_checkpoint(adapter, revision=adapter_revision, cache_dir=hub["cache_dir"],
                                     local_files_only=hub["local_files_only"], token=hub["token"])
    elif adapter_revision is not None:
        raise ArgumentError("adapter_revision= picks the revision of adapter=, and no adapter= was given")
    if adapter is None and (directory / "adapter_config.json").is_file():
        from weightplan.api.adapters import adapter_base, loads_adapter

        if loads_adapter(directory):
            base = adapter_base(directory, hub["variant"], hub["cache_dir"])
            return read_directory(base, hub["variant"]), directory
    return read_directory(directory, hub["variant"]), adapter


def keeps_quantized(dequantize: bool | None, dtype: object, tp: object, merge: bool = False
                    ) -> bool:
    """Whether ``from_pretrained`` builds a quantized checkpoint's model with its quantized
    layers, keeping the weights and scales as they are: ``dequantize=True`` never,
    ``False`` always (a format no model holds here is then an error:
    :func:`~weightplan.bridge.quantized.hold_quantized`), ``None`` (default) unless
    ``dtype`` names a dtype (a dequantized model of that dtype) or ``tp`` is given
    (transformers runs FP8 layers under TP on local tensors, not on the DTensors a ``tp``
    load writes), never with ``merge`` (an adapter folded into the dequantized weights).
    FP8 matmuls need transformers' GPU kernels: to run the model on a CPU, dequantize.

    Raises:
        ArgumentError: ``dequantize`` isn't a bool or ``None``; ``dequantize=False`` with
            ``merge``.
        ParallelError: ``dequantize=False`` with ``tp``.
    """
    if dequantize is not None and not isinstance(dequantize, bool):
        raise ArgumentError(f"from_pretrained(dequantize={dequantize!r}): pass True/False/None")
    if dequantize is False and tp is not None:
        raise ParallelError("from_pretrained(tp=..., dequantize=False): FP8 layers under tensor "
                            "parallelism run on local tensors in transformers, not on the "
                            "DTensors this load writes; drop dequantize=False to load them "
                            "dequantized, or plan the ranks offline (weightplan explain DIR "
                            "--tp N)")
    if dequantize is False and merge:
        raise ArgumentError("from_pretrained(merge=True, dequantize=False): a merge folds the "
                            "adapter into dequantized base weights, so nothing stays quantized; "
                            "drop dequantize=False (save with quantize='fp8' to re-quantize), "
                            "or drop merge=True to keep the base FP8 with the adapter beside it")
    if dequantize is not None or merge:
        return not (dequantize or merge)
    return tp is None and (dtype is None or dtype == "auto")


def _runs_kept(keep: bool, dequantize: bool | None, read: DirectoryRead) -> tuple[bool, bool]:
    """``keep``, as transformers decides for a block-FP8 checkpoint: its FP8 layers run on
    a CUDA GPU of compute capability 8.9 or more, or an XPU; on any other machine it loads
    dequantized, with a warning (a kept model there failed at its first forward, where
    transformers' ran), unless ``dequantize=False`` asks to keep it anyway (the pair's
    second: then it must be kept)."""
    if not keep or dequantize is not None or _fp8_runs_here():
        return keep, dequantize is False
    from weightplan.bridge.quantized import holdable

    directory, path, config = read.directory, read.directory / "config.json", read.config or {}
    text = config.get("text_config")
    quantization = config.get("quantization_config") or (
        text.get("quantization_config") if isinstance(text, dict) else None)
    # (said of a format a model would hold only: any other loads dequantized everywhere)
    if isinstance(quantization, dict) and holdable(quantization, path) is not None:
        import warnings

        warnings.warn(f"{directory}: FP8 layers need a GPU of compute capability 8.9+ or an "
                      "XPU, and this machine has none: loaded dequantized, as transformers "
                      "does (dequantize=False keeps the FP8 weights)", UserWarning, stacklevel=6)
    return False, False


def _fp8_runs_here() -> bool:
    """Whether transformers runs FP8 layers on this machine (its quantizer's test)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_capability() >= (8, 9)
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def _sided(model: torch.nn.Module, dequantize_on: str) -> torch.nn.Module:
    """``model``, once known to dequantize when ``dequantize_on`` sides its dequantizes.

    Raises:
        ArgumentError: a side asked for, but the model keeps the FP8 weights (nothing is
            dequantized)."""
    if dequantize_on != "auto" and getattr(model, "hf_quantizer", None) is not None:
        raise ArgumentError(f"from_pretrained(dequantize_on={dequantize_on!r}) sides the FP8 "
                            "dequantizes, but this load keeps the quantized weights as they "
                            "are (nothing is dequantized): pass dequantize=True (or a dtype) "
                            "to load them dequantized")
    return model


def _one_return(return_report: bool, output_loading_info: bool, dequantize_on: object) -> None:
    """Keywords checked before anything is built.

    Raises:
        ArgumentError: both returns asked for.
        PlanError: ``dequantize_on`` is not ``"auto"``, ``"host"`` or ``"device"``."""
    if return_report and output_loading_info:
        raise ArgumentError("pass return_report=True or output_loading_info=True, not both")
    if dequantize_on != "auto":  # (its module only when a side is asked for)
        from weightplan.planner.tensors.schedule.dequant_side import check_mode

        check_mode(dequantize_on)


def _rank_device(device: object, mesh: Any) -> object:
    """Under TP on GPUs, this rank's GPU (the one the process group bound it to)."""
    if mesh is None or device is not None or mesh.device_type == "cpu":
        return device
    return torch.device(mesh.device_type, torch.accelerator.current_device_index())


def _explain(model: torch.nn.Module, read: DirectoryRead, adapter: Any, adapter_name: str,
             merge: bool, **options: Any) -> Any:
    """The plan of ``read``'s checkpoint (what was read of it, passed down as the checkpoint)."""
    if adapter is not None:
        from weightplan.api.adapters import explain_with_adapter

        return explain_with_adapter(model, read, adapter, adapter_name=adapter_name,
                                    merge=merge, **options)
    if merge:
        raise ArgumentError("merge=True merges an adapter: pass adapter=ADAPTER_DIR too")
    from weightplan.api.entry import explain

    return explain(model, read, **options)


@contextmanager
def _agreed(tp: TensorParallel | None) -> Iterator[None]:
    """The ranks of a cooperative load agree once each has found its checkpoint and built
    its model (the process group runs by then): a rank whose copy is missing or whose
    config fails makes the others raise :class:`~weightplan.errors.RankFailedError`
    instead of waiting in the planning's agreement until the group's timeout (other
    loads: nothing to agree on)."""
    if tp is None or not tp.cooperative:
        yield
        return
    from weightplan.planner.pipelines.agreement import Agreement, planning_group

    with Agreement(planning_group(tp, False), "to find its checkpoint and build the model"
                   ) as agreement:
        yield
        agreement.agree()


def _parallel(tp: object) -> tuple[TensorParallel | None, Any]:
    """``tp`` checked for a model that runs, and this rank's mesh (the process group started
    from torchrun's environment when none runs)."""
    tensor_parallel = as_tensor_parallel(tp)
    if tensor_parallel is None:
        return None, None
    if tensor_parallel.mesh is None and tensor_parallel.world_size is not None:
        raise ParallelError("from_pretrained(tp=...) returns a model that runs across the ranks "
                            "of a process group; world_size=/rank= plan one rank offline: for "
                            "that, weightplan.explain(model, path, tp=TensorParallel("
                            "world_size=..., rank=..., output='local'))")
    if tensor_parallel.output != "dtensor":
        raise ParallelError("from_pretrained(tp=...) needs output='dtensor': the prepared "
                            "modules combine DTensor parameters; for plain local shards, "
                            "weightplan.explain(model, path, tp=TensorParallel(output='local'))")
    return tensor_parallel, tensor_parallel.ranks().mesh


def _built(read: DirectoryRead, tp: TensorParallel | None, mesh: Any,
           implementations: tuple[str | None, str | None, Any, Any, Any], progress: bool | None,
           quantized: tuple[bool, bool | None, str], dtype: object) -> torch.nn.Module:
    """The model on meta; ``quantized``: (:func:`keeps_quantized`, dequantize, dequantize_on)."""
    from weightplan.bridge.distribute import prepare_tensor_parallel
    from weightplan.bridge.hub import build_empty_model

    with status(f"building the model {read.directory / 'config.json'} names (on meta)",
                "built the model", progress):
        attn, experts, model_class, trust, overrides = implementations  # (model_class: the class built, if given)
        keep = _runs_kept(quantized[0], quantized[1], read)
        built = build_empty_model(read.path, attn_implementation=attn, trust_remote_code=trust,
                                  experts_implementation=experts, model_class=model_class,
                                  keep_quantized=keep[0], must_keep=keep[1],
                                  dtype=_build_dtype(dtype, read), config_json=read.config, overrides=overrides)
        model = built.model
        if built.note is not None:
            import warnings

            warnings.warn(built.note, UserWarning, stacklevel=5)
        if tp is not None:
            prepare_tensor_parallel(model, tp, mesh)
    return _sided(model, quantized[2])


def _build_dtype(dtype: object, read: DirectoryRead) -> torch.dtype | None:
    """The dtype the load will write, as transformers resolves it before building the model
    (``"auto"``: config.json's, else the checkpoint's headers, which the plan then takes as
    read): the model is built under it."""
    from weightplan.planner.inputs.dtype import dtype_of

    words = read.config or {}
    config = SimpleNamespace(**{k: v for k, v in words.items() if k in ("dtype", "torch_dtype")})
    return dtype_of(dtype, config, lambda: read.checkpoint)


def _finish_quantized(model: torch.nn.Module) -> torch.nn.Module:
    """What transformers' quantizer does after a load (the model's config then carries its
    quantization config object, and the modules are marked quantized)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    try:
        quantizer.postprocess_model(model)
    except Exception as e:  # transformers' own post-processing, whatever it raises
        raise ModelBuildError(f"transformers can't finish the quantized {type(model).__name__}"
                              f": {type(e).__name__}: {e}") from e
    return model


def loading_info(report: Any, model: ModelInfo | None) -> dict[str, Any]:
    """transformers' ``output_loading_info`` dict from a load's report (shape mismatches
    never load: they are refused before anything is written; a missing tie: every name)."""
    missing = set(report.missing) if model is None else model.every_name(report.missing)
    return {"missing_keys": missing, "unexpected_keys": set(report.unexpected),
            "mismatched_keys": set(), "error_msgs": []}


def _generation_config(model: torch.nn.Module, directory: Path, given: Any) -> None:
    if given is not None:
        model.generation_config = given
        return
    path = directory / "generation_config.json"  # (the checkpoint's directory)
    current = getattr(model, "generation_config", None)
    if current is None or not os.path.lexists(path):
        return
    from weightplan.bridge.config_guard import read_config_json

    data = read_config_json(path)  # a regular file, size-capped, strict JSON: then transformers
    try:
        generation = type(current).from_dict(data)
        generation._original_object_hash = hash(generation)  # as from_pretrained marks it
        model.generation_config = generation
    except Exception as e:  # transformers' own validation of the file
        raise ModelBuildError(f"{path}: transformers can't read this generation config: "
                              f"{type(e).__name__}: {e}") from e
