"""Running a model placed on several devices, or partly on the disk: accelerate's
``dispatch_model`` and its hooks are the runtime (nothing home-made here).

After the load (:meth:`weightplan.Plan.execute`), a placement that spans more than one
device, or puts modules on ``"disk"``, is dispatched as transformers dispatches its own:
activations move between devices at module boundaries, and offloaded modules' weights
(left on meta by the load) are read back at forward time from safetensors files (an
``offload_index`` of ``{"safetensors_file", "weight_name", "dtype"}``): the checkpoint's own
for the tensors it holds as they are, the ones the load wrote for the converted.
accelerate is optional: it is imported only here, only for such placements.

An adapter's layers (peft's, injected by ``from_pretrained(..., adapter=)``) load their
whole subtree at their own forward (accelerate's ``preload_module_classes``): a DoRA
layer hands its base layer and factors to its magnitude module as arguments and reads
their weights outside their own forwards, and a LoRA embedding reads its factors from a
``ParameterDict`` that is never called; hooked one module at a time, those weights are
still on meta when read.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping

import torch

from weightplan.errors import ExecutionError, PlanError
from weightplan.planner.tensors.schedule.device_budgets import DISK
from weightplan.planner.tensors.schedule.device_plan import DevicePlacement
from weightplan.planner.write.offloaded import attach_offloaded


def needs_hooks(placement: DevicePlacement) -> bool:
    """More than one device, or the disk: the model runs through accelerate's hooks."""
    devices = {d for _, d in placement.device_map}
    return len(devices) > 1 or DISK in devices


def check_dispatchable(placement: DevicePlacement) -> None:
    """At plan time: a placement that needs hooks needs accelerate.

    Raises:
        PlanError: accelerate is not installed (says how to get it, or what to pass).
    """
    if needs_hooks(placement) and importlib.util.find_spec("accelerate") is None:
        raise PlanError("this placement spans several devices (or the disk): running it "
                        "needs accelerate's hooks; pip install accelerate, or give one "
                        "device enough max_memory for the whole model")


def dispatch(model: torch.nn.Module, placement: DevicePlacement,
             offloaded: Mapping[str, str]) -> None:
    """Attach accelerate's hooks for ``placement`` (nothing when it is one device).

    Raises:
        ExecutionError: accelerate refuses the map (its message, chained).
    """
    if not needs_hooks(placement):
        return
    from accelerate import dispatch_model

    device_map = dict(placement.device_map)
    referenced = placement.offload.index() if placement.offload is not None else {}
    index = {name: {"safetensors_file": path, "weight_name": _weight_name(name, offloaded),
                    "dtype": str(_dtype(model, name)).removeprefix("torch.")}
             for name, path in offloaded.items() if name not in referenced}
    index.update(referenced)  # (read in place from the checkpoint: see offload_plan.py)
    try:
        dispatch_model(model, device_map=device_map, main_device=placement.main_device,
                       offload_dir=placement.offload_folder if index else None,
                       offload_index=index or None,
                       preload_module_classes=adapter_layer_classes(model) or None)
    except (ValueError, RuntimeError, KeyError) as e:
        raise ExecutionError(f"accelerate's dispatch_model refused the placement: {e}") from e
    attach_offloaded(model, index)  # (a save reads the offloaded tensors from there)


def adapter_layer_classes(model: torch.nn.Module) -> list[str]:
    """The class names of the model's peft adapter layers (none when peft was never
    imported: no model has them then), for ``preload_module_classes``."""
    if "peft" not in sys.modules:
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, BaseTunerLayer)})


def _weight_name(name: str, offloaded: Mapping[str, str]) -> str:
    """The key inside the file: the tensor's own name (an alias shares its file)."""
    return os.path.basename(offloaded[name]).removesuffix(".safetensors")


def _dtype(model: torch.nn.Module, name: str) -> torch.dtype:
    try:
        return model.get_parameter(name).dtype
    except AttributeError as e:
        raise PlanError(f"offloaded {name} is not a parameter of the model") from e
