"""Before a byte is loaded: the model is still the one the plan was made for.

A plan writes into the model's tensors by byte offsets and strides worked out at
``explain()``. A model cast since (``m.double()``, ``.half()``), or a parameter replaced by
a tensor of the same shape with other strides, would take those bytes as garbage; a tie
undone (or made) since would leave one side unloaded (or written twice over). So each
destination is compared with what the plan saw: on meta or allocated, shape, dtype,
strides, and which names share it; and no two tensors written in place may share memory.
Any difference refuses the load, naming the key and what changed, before anything is
written.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import torch
from torch import nn

from weightplan.errors import PlanError
from weightplan.executor.model_sink import current_tensor
from weightplan.planner.inputs.model_info import ModelTensor
from weightplan.planner.tensors.ir.destination import Destination


def check_unchanged(model: nn.Module, dest: Destination, planned: ModelTensor | None) -> None:
    """:class:`PlanError` if ``dest``'s tensor is not as ``explain()`` saw it."""
    tensor = current_tensor(model, dest.key)
    change = _change(model, tensor, dest, planned)
    if change:
        raise PlanError(f"the model changed since explain(): {dest.key} {change}; call "
                        "explain() again (nothing was loaded)")


def _change(model: nn.Module, tensor: torch.Tensor, dest: Destination,
            planned: ModelTensor | None) -> str | None:
    shape = dest.shard.global_shape if dest.shard is not None else dest.spec.shape
    untied = planned is not None and planned.untied  # (allocated, whatever it shared)
    if (tensor.is_meta != dest.allocates and not untied) or tuple(tensor.shape) != shape:
        state = "on meta" if tensor.is_meta else "allocated"
        return f"is now {state} with shape {list(tensor.shape)}"
    if planned is None:
        return None
    if tensor.dtype != planned.spec.dtype:
        return f"is now {_name(tensor.dtype)}, the plan was made for {_name(planned.spec.dtype)}"
    if dest.allocates:
        return None
    if tuple(tensor.stride()) != tuple(planned.stride):
        return (f"now has strides {tuple(tensor.stride())}, the plan was made for "
                f"{tuple(planned.stride)}")
    for alias in dest.aliases:
        if alias != dest.key and current_tensor(model, alias) is not tensor:
            return f"is no longer one tensor with {alias} (tied when the plan was made)"
    return None


def check_separate(model: nn.Module, dests: Iterable[Destination]) -> None:
    """:class:`PlanError` when two tensors written in place share memory: one would be
    written over the other."""
    spans = []
    for dest in dests:
        if dest.allocates or not dest.written:
            continue
        tensor = current_tensor(model, dest.key).detach()
        if tensor.numel() and not tensor.is_meta:
            start = tensor.data_ptr()
            extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(),
                                                         strict=True))
            spans.append((str(tensor.device), start, start + extent * tensor.element_size(),
                          dest.key))
    spans.sort()
    for (device, _, end, key), (other_device, start, _, other) in pairwise(spans):
        if device == other_device and start < end:
            raise PlanError(f"the model changed since explain(): {key} and {other} now share "
                            "memory, the plan writes them separately (one would overwrite the "
                            "other); tie them as one tensor or give each its own, then call "
                            "explain() again (nothing was loaded)")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
