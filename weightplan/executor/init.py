"""Tensors no checkpoint holds: allocate them and run the model's own init on them.

Runs at commit, *before* loaded tensors are installed: loaded tensors are still on meta
then, where any init is a no-op, and real tensors of a partly allocated model are marked
``_is_hf_initialized`` (the flag transformers' guarded init functions honour) while the
init runs, so only the fresh tensors change. Which init: the model's ``_init_weights``
(transformers, dispatched per sub-model as ``initialize_weights`` does, see
:mod:`weightplan.planner.inputs.model_init`), else the module's ``reset_parameters()``,
else zeros. Meta buffers are rebuilt the same way (the plan refused those no init writes).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

from weightplan.planner.inputs.device import CPU, DeviceMap
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor
from weightplan.planner.inputs.model_init import init_chain, owner_name

FLAG = "_is_hf_initialized"


def module_and_attr(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding the tensor ``name`` (``"model.embed.weight"``) and its attribute."""
    path, _, attr = name.rpartition(".")
    return (model.get_submodule(path) if path else model), attr


def _allocate(model: nn.Module, info: ModelTensor, device: torch.device,
              dtype: torch.dtype | None) -> torch.Tensor:
    cast = dtype is not None and info.spec.dtype.is_floating_point and not info.keep_dtype
    tensor = torch.empty(info.spec.shape, dtype=dtype if cast else info.spec.dtype,
                         device=device)
    if not info.is_buffer:
        grad = info.requires_grad and tensor.is_floating_point()
        tensor = nn.Parameter(tensor, requires_grad=grad)
    for alias in info.aliases:
        module, attr = module_and_attr(model, alias)
        if info.is_buffer:
            module._buffers[attr] = tensor
        else:
            module._parameters[attr] = tensor  # type: ignore[assignment]
    return tensor


def _allocate_buffer(model: nn.Module, name: str, device: torch.device) -> torch.Tensor:
    module, attr = module_and_attr(model, name)
    old = module.get_buffer(attr)
    new = torch.empty(old.shape, dtype=old.dtype, device=device)
    module._buffers[attr] = new
    return new


@contextlib.contextmanager
def _others_marked(model: nn.Module, fresh: set[int]) -> Iterator[None]:
    """Flag every real tensor that is not fresh as initialized while the init runs."""
    marked = []
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in fresh or tensor.is_meta or getattr(tensor, FLAG, False):
            continue
        setattr(tensor, FLAG, True)
        marked.append(tensor)
    guard = getattr(sys.modules.get("transformers.initialization"),
                    "guard_torch_init_functions", None)
    try:
        with torch.no_grad(), (guard() if callable(guard) else contextlib.nullcontext()):
            yield
    finally:
        for tensor in marked:
            delattr(tensor, FLAG)


def initialize_fresh(model: nn.Module, info: ModelInfo, names: list[str],
                     dtype: torch.dtype | None = None, devices: DeviceMap | None = None
                     ) -> dict[str, str]:
    """Allocate the meta tensors ``names`` (floating ones in ``dtype`` when given) and the
    model's meta buffers; initialize them.

    Returns ``{name: how it was initialized}`` for the tensors in ``names``.
    """
    where = devices.device_for if devices is not None else (lambda _: CPU)
    fresh: dict[str, torch.Tensor] = {}
    for name in names:
        entry = info.get(name)
        if entry is not None and entry.on_meta:
            fresh[name] = _allocate(model, entry, where(name), dtype)
    for name in info.meta_buffers:
        fresh[name] = _allocate_buffer(model, name, where(name))
    if devices is not None:
        _move_buffers(model, devices, set(fresh))
    if not fresh:
        return {}
    done: dict[str, str] = {}
    with _others_marked(model, {id(t) for t in fresh.values()}):
        for path, members in _by_module(fresh).items():
            chain = init_chain(model, path)
            how = _run_chain(chain) if chain else _reset(model, path, members, fresh)
            done.update({m: how for m in members})
    return {name: done[name] for name in names if name in done}


def _move_buffers(model: nn.Module, devices: DeviceMap, fresh: set[str]) -> None:
    """Real buffers (computed at build time, on the CPU) go where their module is loaded."""
    for name, buffer in list(model.named_buffers()):
        device = devices.device_for(name)
        if name not in fresh and not buffer.is_meta and buffer.device != device:
            module, attr = module_and_attr(model, name)
            module._buffers[attr] = buffer.to(device)


def _by_module(fresh: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in fresh:
        out.setdefault(name.rpartition(".")[0], []).append(name)
    return out


def _run_chain(chain: list[tuple[nn.Module, Callable[[nn.Module], None]]]) -> str:
    for module, init in chain:
        init(module)
    return owner_name(chain[0][1])


def _reset(model: nn.Module, path: str, members: list[str],
           fresh: dict[str, torch.Tensor]) -> str:
    for name in members:
        fresh[name].zero_()
    module = model.get_submodule(path) if path else model
    reset = getattr(module, "reset_parameters", None)
    if not callable(reset):
        return "zeros (its module has no reset_parameters)"
    try:
        reset()
    except Exception as e:  # a module mixing meta and real tensors may refuse
        return f"zeros (reset_parameters failed: {e})"
    return f"{type(module).__name__}.reset_parameters()"
