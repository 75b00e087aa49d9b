"""A save of a model whose modules are offloaded to the disk (``device_map`` with
``"disk"``): their parameters are on meta, their bytes in safetensors files (accelerate's
``offload_index``, which the load recorded on the model: the checkpoint's own files for
the tensors referenced in place, the files the load wrote for the others). The save's
source is then one checkpoint of both kinds of entries: the model's tensors in memory,
the offloaded ones in their files, read (or copied) from there like any checkpoint's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from weightplan.errors import SaveError
from weightplan.planner.inputs.checkpoint import Checkpoint, TensorEntry, open_checkpoint
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.units import agreeing, counted

OFFLOAD_ATTRIBUTE = "_weightplan_offloaded"


def attach_offloaded(model: nn.Module, index: Mapping[str, Mapping[str, str]]) -> None:
    """Keep where ``model``'s offloaded tensors are (name → ``{"safetensors_file",
    "weight_name", "dtype"}``; a plain attribute, not part of its state)."""
    object.__setattr__(model, OFFLOAD_ATTRIBUTE, {k: dict(v) for k, v in index.items()})


def get_offloaded(model: nn.Module) -> Mapping[str, Mapping[str, str]]:
    return getattr(model, OFFLOAD_ATTRIBUTE, None) or {}


def model_source(state: Mapping[str, torch.Tensor], info: ModelInfo,
                 index: Mapping[str, Mapping[str, str]], recorded: bool = False) -> Checkpoint:
    """``state`` (the tensors a save writes) as a checkpoint: its meta tensors read from
    the files ``index`` places them in (a tied name through its tensor's other names).
    ``recorded``: the save writes each tensor in the dtype the load record says (the
    checkpoint's), so a file's float tensor the hooks cast to the model's dtype (a
    checkpoint referenced in place under another float ``dtype``) is read as it is; else
    the save writes the model's dtypes, which such a file doesn't hold.

    Raises:
        SaveError: a meta tensor that is not offloaded (it has no values), or whose file
            holds another shape or dtype than the model's.
    """
    where = {a: index[n] for t in info.unique() for n in t.aliases if n in index
             for a in t.aliases}
    meta = [k for k, v in state.items() if v.is_meta]
    lost = sorted(k for k in meta if k not in where)
    if lost:
        raise SaveError(f"{counted(len(lost), 'tensor')} {agreeing(len(lost), 'is', 'are')} on the "
                        f"meta device and {agreeing(len(lost), 'has', 'have')} no values to "
                        f"save: {', '.join(lost[:5])}")
    memory = open_checkpoint({k: v for k, v in state.items() if not v.is_meta})
    if not meta:
        return memory
    disk = open_checkpoint(sorted({where[k]["safetensors_file"] for k in meta}))
    entries = dict(memory.entries)
    for key in meta:
        entry = disk.entries.get(where[key]["weight_name"])
        want = state[key]
        if entry is None or entry.spec.shape != tuple(want.shape) or not (
                entry.spec.dtype == want.dtype or recorded and _cast(entry.spec.dtype,
                                                                     want.dtype)):
            raise SaveError(f"offloaded {key}: {where[key]['safetensors_file']} holds "
                            f"{'no ' + where[key]['weight_name'] if entry is None else entry.spec}"
                            f", not the model's {want.dtype} {list(want.shape)}")
        entries[key] = TensorEntry(key, entry.spec, entry.file, entry.offset)
    return Checkpoint({k: entries[k] for k in state}, disk.files, memory.tensors,
                      description=memory.description)


def _cast(stored: torch.dtype, model: torch.dtype) -> bool:
    """Whether the hooks may hand a tensor stored in ``stored`` to the model in ``model``:
    the float cast a tensor referenced in place may have (as
    :func:`~weightplan.planner.tensors.schedule.offload_plan.in_place_source` allows)."""
    return stored.is_floating_point and model.is_floating_point
