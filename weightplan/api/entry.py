"""``explain`` / ``explain_save`` / ``explain_convert``: the planner's entry points, with
the transformers bridge plugged into the mapping lookup, returning user-facing plans."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import torch

from weightplan.api.hub import refuse_repo_id
from weightplan.api.plans import Plan, promote
from weightplan.errors import AdapterError, ArgumentError, CheckpointError, MappingError, SaveError
from weightplan.planner.inputs.paths import is_adapter_dir
from weightplan.planner.pipelines.load import explain_load
from weightplan.planner.keys.lookup import Finder, is_transformers_class

if TYPE_CHECKING:
    from weightplan.api.write_plans import WritePlan
    from weightplan.planner.pipelines.plan import LoadPlanData
    from weightplan.planner.keys.registry import MappingChoice


def bridge_for(model: torch.nn.Module | None) -> Finder | None:
    """transformers' own mappings, for transformers models whose family isn't built in."""
    if model is None or not any(is_transformers_class(m) for m in model.modules()):
        return None
    from weightplan.bridge.transformers import TransformersFinder  # (a transformers model)

    return TransformersFinder()


def by_name(mapping: object) -> object:
    """A mapping given by name: registered, else bridged from transformers (or a typo hint)."""
    if not isinstance(mapping, str):
        return mapping
    from weightplan.bridge.names import named_choice  # (a name: the bridge may know it)

    return named_choice(mapping)


def _explain_adapter(model: torch.nn.Module, checkpoint: object, name: str | None, mapping: object,
                     **options: Any) -> Plan:
    """An adapter directory into the adapter ``name`` injected in ``model`` (a directory
    holding a model too: :func:`_explain_embedded`)."""
    from weightplan.planner.inputs.adapter import read_adapter  # (adapters only)
    from weightplan.planner.pipelines.adapter_load import explain_adapter_load

    if is_adapter_dir(checkpoint) and _holds_model(checkpoint):
        return _explain_embedded(model, checkpoint, name, mapping, **options)
    adapter = read_adapter(_adapter_dir(checkpoint))
    _placed_with_base(checkpoint, options)
    # (every option forwarded, as to a model's load: dequantize_on checked and sided, cooperative=
    # without tp= refused; a placement was refused above)
    return promote(Plan, explain_adapter_load(model, adapter, name=name or "default", mapping=by_name(mapping),
                                              finder=bridge_for(model) if mapping is None else None, **options))


def _placed_with_base(checkpoint: object, options: dict[str, Any]) -> None:
    """An adapter alone goes where its layers' base weights are: a placement (an automatic
    strategy, the disk, ``max_memory``, ``offload_folder``) is made with the base's load.

    Raises:
        ArgumentError: a placement asked for (was ignored: the adapter loaded as if none)."""
    device = options["device"]
    automatic = isinstance(device, str) and device in ("auto", "balanced", "balanced_low_0", "sequential")
    disk = isinstance(device, dict) and "disk" in device.values()
    if automatic or disk or options["max_memory"] is not None or options["offload_folder"] is not None:
        raise ArgumentError(f"{checkpoint}: an adapter alone loads where its layers' base weights are; "
                            "device_map=/max_memory=/offload_folder= place a model when its base loads: "
                            "weightplan.from_pretrained(BASE, adapter=ADAPTER_DIR, device_map=...)")


def _adapter_dir(checkpoint: object) -> str:
    if not isinstance(checkpoint, (str, os.PathLike)) or not os.path.isdir(checkpoint):
        raise AdapterError(f"adapter_name= needs an adapter directory (adapter_config.json + "
                           f"adapter_model.safetensors) as the checkpoint, got {checkpoint!r}")
    return os.fspath(checkpoint)


def explain(model: torch.nn.Module | None, checkpoint: object, *, mapping: object = None,
            dtype: torch.dtype | str | None = None, budget: int | str | None = None,
            tp: object = None, quantization: object = None, threads: int = 4,
            device: object = None, device_map: object = None, max_memory: object = None,
            offload_folder: object = None, cooperative: bool = False,
            adapter_name: str | None = None, dequantize_on: str = "auto", variant: str | None = None) -> Plan:
    """Plan loading ``checkpoint`` into ``model`` from headers only; nothing is read or written.

    Args:
        model: a ``torch.nn.Module`` (usually on ``meta``), or ``None`` (keys only).
        checkpoint, variant: a ``.safetensors`` file, a directory (``variant="fp16"``: its
            ``model.fp16.safetensors``, as ``from_pretrained(variant=...)``), a list of files, or a dict.
        mapping: ``None`` (the registry, looked up per submodule depth first; else
            transformers' own mapping through :mod:`weightplan.bridge`), a registered
            name, or a list of transforms. Legacy ``LayerNorm.gamma/beta`` renames apply.
        dtype: cast floating tensors of a meta model to this dtype; ``"auto"``: the
            config's, else the checkpoint's (fp32 modules kept as transformers does).
        budget: bytes (or ``"8GiB"``) the load may add at most; raises
            :class:`BudgetError` with the smallest budget that works when impossible.
        tp: ``None``, ``"auto"`` or a :class:`~weightplan.TensorParallel`: this rank's
            part only; parameters become DTensors (transformers' placements) or local.
        quantization: reserved for quantized loading.
        threads: reader threads (``0``, or ``WEIGHTPLAN_SYNC_LOAD=1``, reads inline).
        device: where meta tensors are allocated: ``"cpu"``, ``"cuda:1"``, a
            ``torch.device``, or ``{module prefix: device}``.
        device_map, max_memory, offload_folder: transformers' words: ``device``, or
            ``"auto"`` / ``"balanced"`` / ``"sequential"`` over ``max_memory``'s devices
            (absent ones: a dry run), the rest on ``"disk"`` in ``offload_folder``.
        cooperative: with ``tp``: whole tensors read by one rank and broadcast.
        adapter_name: the injected peft adapter a LoRA ``checkpoint`` loads into.
        dequantize_on: FP8 dequantized ``"auto"`` (GPU destination: there), ``"host"``, ``"device"``.

    Returns:
        A :class:`Plan` reporting missing / unexpected / mismatched keys; configuration
        errors raise (an adapter with no tensor in place: :class:`AdapterError`).

    Example:
        >>> plan = explain(model, "ckpt_dir/"); print(plan); plan.execute()  # doctest: +SKIP
    """
    refuse_repo_id(checkpoint, "explain/load", adapter=adapter_name is not None)
    checkpoint = checkpoint if variant is None else _for_variant(checkpoint, variant, adapter_name)
    options: dict[str, Any] = dict(
        dtype=dtype, budget=budget, tp=tp, quantization=quantization, threads=threads, max_memory=max_memory,
        offload_folder=offload_folder, cooperative=cooperative, dequantize_on=dequantize_on,
        device=device if device_map is None else _device_from_map(device_map, device, tp))
    if model is not None and (adapter_name is not None or is_adapter_dir(checkpoint)):
        return _explain_adapter(model, checkpoint, adapter_name, mapping, **options)
    data = explain_load(model, checkpoint, mapping=by_name(mapping),
                        finder=bridge_for(model) if mapping is None else None, **options)
    return _dispatchable(promote(Plan, data))


def _holds_model(checkpoint: object) -> bool:
    """Whether an adapter directory holds a model too (``config.json`` beside
    ``adapter_config.json``: peft's ``save_pretrained`` into the model's directory)."""
    return isinstance(checkpoint, (str, os.PathLike)) and os.path.isfile(
        os.path.join(os.fspath(checkpoint), "config.json"))


def _explain_embedded(model: torch.nn.Module, directory: object, adapter_name: str | None,
                      mapping: object, **options: Any) -> Plan:
    """A directory holding a model and an adapter, into ``model``: a model with no LoRA
    layers (and no ``adapter_name=``) gets the model's weights, the plan noting the adapter
    not loaded and how to load it; one with the adapter injected (peft's ``get_peft_model``,
    ``inject_adapter_in_model``) gets both in one plan, as ``from_pretrained(directory)``."""
    from weightplan.bridge.config_guard import read_directory
    from weightplan.planner.inputs.adapter_model import injected_adapters

    read = read_directory(directory)
    if adapter_name is None and not injected_adapters(model):
        data = explain_load(model, read, mapping=by_name(mapping),
                            finder=bridge_for(model) if mapping is None else None, **options)
        return _dispatchable(promote(Plan, _adapter_left(data, read.directory)))
    from weightplan.planner.inputs.adapter import read_adapter  # (adapters only)
    from weightplan.planner.inputs.checkpoint import open_checkpoint
    from weightplan.planner.pipelines.adapter_load import explain_base_and_adapter
    from weightplan.planner.pipelines.load import choose_mapping

    target = _peft_inner(model)
    choice = choose_mapping(by_name(mapping), target, bridge_for(target) if mapping is None else None)
    data = explain_base_and_adapter(target, open_checkpoint(read), read_adapter(read.directory), choice,
                                    name=adapter_name or "default", **options)
    return _dispatchable(promote(Plan, data))


def _peft_inner(model: torch.nn.Module) -> torch.nn.Module:
    """The model peft wraps (a ``PeftModel``'s ``base_model.model``: the base checkpoint's
    keys name its tensors), else ``model`` (the adapter injected in place)."""
    from weightplan.planner.inputs.adapter_model import PEFT_PREFIX

    if not type(model).__name__.startswith("Peft"):
        return model
    return model.get_submodule(PEFT_PREFIX.removesuffix("."))


def _adapter_left(data: LoadPlanData, directory: os.PathLike[str]) -> LoadPlanData:
    """``data`` noting the adapter beside the model, not loaded into a model without LoRA
    layers (and warning: ``load`` shows no plan)."""
    import warnings

    from weightplan.planner.core.problems import Note

    config = os.path.join(os.fspath(directory), "adapter_config.json")
    said = (f"{config}: the adapter beside the model is not loaded: this model has no LoRA "
            "layers; to load both, inject it first (peft's get_peft_model or "
            "inject_adapter_in_model, then explain/load this directory again), or "
            f"weightplan.from_pretrained({os.fspath(directory)!r})")
    warnings.warn(said, UserWarning, stacklevel=6)
    findings = dataclasses.replace(data.findings, notes=data.findings.notes + (Note(config, said),))
    return dataclasses.replace(data, findings=findings)


def _for_variant(checkpoint: object, variant: str, adapter_name: str | None) -> object:
    """``checkpoint`` read for ``variant``'s files with its ``config.json`` (its quantization
    config: :func:`~weightplan.bridge.config_guard.read_directory`): a model's weight files
    (an adapter's have no variant: refused, saying where the variant goes)."""
    from weightplan.bridge.config_guard import read_directory

    if adapter_name is not None or is_adapter_dir(checkpoint):
        raise ArgumentError(f"variant={variant!r} picks a model's weight files, and {checkpoint} is "
                            "an adapter directory (peft's adapter files have no variant): drop "
                            "variant=, or load the base's variant with the adapter: "
                            f"weightplan.from_pretrained(BASE, variant={variant!r}, adapter=ADAPTER_DIR)")
    return read_directory(checkpoint, variant)


def _device_from_map(device_map: object, device: object, tp: object) -> object:
    from weightplan.api.keywords import device_from_map  # (transformers' word, given)

    return device_from_map(device_map, device, tp, caller="explain")


def _dispatchable(plan: Plan) -> Plan:
    """A placement over several devices runs through accelerate: checked at plan time."""
    if plan.options.placement is not None:
        from weightplan.bridge.offload import check_dispatchable

        check_dispatchable(plan.options.placement)
    return plan


def explain_save(model: torch.nn.Module, directory: str | os.PathLike[str], *,
                 mapping: object = None, max_shard_size: int | str = "5GB",
                 overwrite: bool = False, threads: int = 4, quantize: str | None = None
                 ) -> WritePlan:
    """Plan writing ``model`` to ``directory`` in its checkpoint's original layout.

    Args:
        model: a model with real (not meta) tensors.
        directory: where the shards and ``model.safetensors.index.json`` go.
        mapping: ``None`` uses the record of the model's last weightplan load (exact),
            else the registry's mapping for the model; a name or a list of transforms
            derives the inverse from that mapping instead.
        max_shard_size: bytes per shard (``"5GB"``); a bigger tensor gets its own shard.
        overwrite: replace checkpoint files already in ``directory``.
        threads: writer threads (0: inline).
        quantize: ``"fp8"`` re-quantizes what a dequantizing load widened (or, without a
            load record, the linear weights) into block FP8 + ``weight_scale_inv``.

    Raises:
        NotInvertibleError: a transform of the mapping has no unambiguous inverse.
        SaveError: meta tensors, an unwritable or occupied directory, too little space; a
            LoRA adapter loaded unmerged (``adapter_name=`` saves it).
    """
    from weightplan.api.write_plans import WritePlan
    from weightplan.planner.inputs.adapter_model import injected_adapters
    from weightplan.planner.pipelines.adapter_summary import CONFIGS_ATTRIBUTE
    from weightplan.planner.pipelines.save import explain_save_plan

    loaded = getattr(model, CONFIGS_ATTRIBUTE, None) or ()
    layers = set(injected_adapters(model))  # (lora_A or lora_embedding_A layers)
    adapters = sorted(n for n in loaded if n in layers)  # (merged: no LoRA layers left)
    if adapters:  # (loaded unmerged: its tensors would land in the base's shards)
        names = ", ".join(map(repr, adapters))
        raise SaveError(f"the model holds LoRA adapter {names}, loaded unmerged: its tensors "
                        "would be mixed into the base checkpoint; save the adapter with "
                        f"save(model, dir, adapter_name={adapters[0]!r}), or load with "
                        "merge=True and save the merged model")
    data = explain_save_plan(model, directory, mapping=by_name(mapping), max_shard_size=max_shard_size,
                             overwrite=overwrite, threads=threads, quantize=quantize,
                             finder=bridge_for(model) if mapping is None else None)
    return promote(WritePlan, data)


def _config_mapping(source: object) -> MappingChoice:
    """The mapping of the class the ``config.json`` next to ``source`` names in
    ``architectures`` where one is registered by class name (as transformers looks the class
    up first), else of its ``model_type``: a convert's mapping, said to come from there."""
    from weightplan.api.model_config import config_model_type
    from weightplan.bridge.names import class_choice, named_choice

    mapping, architecture = config_model_type(source)
    by_class = None if architecture is None else class_choice(architecture)
    if by_class is not None:
        return by_class
    if mapping is None:
        if isinstance(source, (str, os.PathLike)) and not os.path.exists(source):
            raise CheckpointError("file not found", file=os.fspath(source))
        raise MappingError(f"{source}: converting needs a mapping, and no config.json next "
                           "to it names a model_type; pass mapping= (a registered name or "
                           "transforms)")
    return named_choice(mapping, why="config.json's model_type")


def explain_convert(source: object, directory: str | os.PathLike[str], *, mapping: object = None,
                    reverse: bool = False, max_shard_size: int | str = "5GB",
                    overwrite: bool = False, threads: int = 4, dequantize: bool = False,
                    to: str | None = None, budget: int | str | None = None, variant: str | None = None
                    ) -> WritePlan:
    """Plan converting a checkpoint on disk to another layout, without a model.

    Args:
        source, variant: a ``.safetensors`` file, a directory (``variant="fp16"``: its
            ``model.fp16.safetensors``, as ``from_pretrained(variant=...)``), files, a dict.
        directory: where the shards and ``model.safetensors.index.json`` go.
        mapping: a registered name or a list of transforms; ``None``: the ``model_type``
            of the ``config.json`` next to ``source``. That config and the generation
            config are copied next to the shards, so the output is a model directory
            ``from_pretrained`` loads; packed-format tensors follow it as stored, merged
            like their weights, for a model holding the format (a floating one: dequantize).
        reverse: ``False`` applies ``mapping`` (with the legacy renames) as a load would;
            ``True`` applies its inverse (a saved model's layout back to the original one).
        max_shard_size: bytes per shard (``"5GB"``); a bigger tensor gets its own shard.
        overwrite, threads: replace checkpoint files already in ``directory``; writer threads (0: inline).
        dequantize: write every quantized weight (block FP8, MXFP4, compressed-tensors,
            ModelOpt NVFP4) dequantized to bf16 under its plain key, without its scales;
            the mapping defaults to none (keys as they are), and the copied config.json
            loses its ``quantization_config``.
        to: ``"fp8"``: each MXFP4 weight re-encoded losslessly as 128×128 block FP8 (float32
            power-of-two ``weight_scale_inv``) under its plain key; an inexact block raises
            :class:`QuantizationError`; config.json says block FP8.
        budget: the most it may hold (reads in flight, outputs not yet written), as a load's.

    Raises:
        MappingError: no mapping, or a converter finds only part of its sources.
        NotInvertibleError: ``reverse`` and a transform has no unambiguous inverse.
        PlanError: ``reverse`` and nothing to reverse (every tensor would be copied as it
            is: the checkpoint is in the original layout already).
        SaveError: an unwritable or occupied directory, too little space.
        BudgetError: no schedule fits ``budget`` (``minimum_bytes``: the smallest that fits).
    """
    from weightplan.api.model_config import check_companions, companion_files
    from weightplan.api.write_plans import WritePlan
    from weightplan.planner.pipelines.save import explain_convert_plan

    if mapping is None:
        mapping = [] if dequantize or to is not None else _config_mapping(source)
    data = explain_convert_plan(source if variant is None else _for_variant(source, variant, None), directory,
                                mapping=by_name(mapping), reverse=reverse, max_shard_size=max_shard_size,
                                overwrite=overwrite, threads=threads, dequantize=dequantize, to=to, budget=budget)
    companions = companion_files(source, quantized=not dequantize and to is None)
    check_companions(companions, directory, overwrite)
    return dataclasses.replace(promote(WritePlan, data), companions=companions,
                               dequantized=dequantize, reencoded=to)
