"""The load sink: destination tensors of a model, and putting loaded tensors into it.

It follows the :class:`~weightplan.executor.sink.Sink` protocol.
"""

from __future__ import annotations

import torch
from torch import nn

from weightplan.errors import PlanError
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor
from weightplan.planner.tensors.destination import Destination, DestKind
from weightplan.planner.tensors.geometry import View


def module_and_attr(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (model.get_submodule(path) if path else model), attr


def current_tensor(model: nn.Module, name: str) -> torch.Tensor:
    module, attr = module_and_attr(model, name)
    tensor: torch.Tensor | None = module._parameters.get(attr)
    if tensor is None:
        tensor = module._buffers.get(attr)
    if tensor is None:
        raise PlanError(f"the model has no tensor {name} any more; call explain() again")
    return tensor


def check_unchanged(model: nn.Module, dest: Destination) -> None:
    """The model must still be as planned: meta where we allocate, real where we write."""
    tensor = current_tensor(model, dest.key)
    if tensor.is_meta != dest.allocates or tuple(tensor.shape) != dest.spec.shape:
        state = "on meta" if tensor.is_meta else "allocated"
        raise PlanError(f"the model changed since explain(): {dest.key} is now {state} with "
                        f"shape {list(tensor.shape)}; call explain() again")


def destination_tensor(model: nn.Module, dest: Destination) -> torch.Tensor:
    """A fresh tensor for an allocating destination, else the model's own storage."""
    if dest.allocates:
        return torch.empty(dest.spec.shape, dtype=dest.spec.dtype)
    return current_tensor(model, dest.key).detach()


def install(model: nn.Module, dest: Destination, tensor: torch.Tensor, info: ModelTensor | None
            ) -> None:
    """Put an allocated tensor into the model under every alias (tied tensors stay tied)."""
    if not dest.allocates:
        return
    is_buffer = info is not None and info.is_buffer
    if is_buffer:
        value: torch.Tensor = tensor
    else:
        grad = (info.requires_grad if info is not None else True) and tensor.is_floating_point()
        value = nn.Parameter(tensor, requires_grad=grad)
    for alias in dest.aliases:
        module, attr = module_and_attr(model, alias)
        if is_buffer:
            module._buffers[attr] = value
        else:
            assert isinstance(value, nn.Parameter)
            module._parameters[attr] = value


def initialize_missing(model: nn.Module, infos: list[ModelTensor | None]) -> dict[str, str]:
    """Give missing meta tensors real storage; ``reset_parameters()`` where modules have it.

    Runs before loaded tensors are installed, so a module's ``reset_parameters`` only
    touches the missing tensors (the rest are still on meta, where init is a no-op).
    """
    done: dict[str, str] = {}
    modules: dict[int, nn.Module] = {}
    for info in infos:
        if info is None or not info.on_meta:
            continue
        tensor = torch.zeros(info.spec.shape, dtype=info.spec.dtype)
        install(model, Destination(info.name, info.aliases, info.spec, DestKind.ALLOCATE, ()),
                tensor, info)
        module, _ = module_and_attr(model, info.name)
        if callable(getattr(module, "reset_parameters", None)):
            modules[id(module)] = module
            done[info.name] = f"{type(module).__name__}.reset_parameters()"
        else:
            done[info.name] = "zeros (its module has no reset_parameters)"
    with torch.no_grad():
        for module in modules.values():
            try:
                module.reset_parameters()  # type: ignore[operator]  # checked callable above
            except Exception as e:  # a module mixing meta and real tensors may refuse
                for info in infos:
                    if info is not None and module_and_attr(model, info.name)[0] is module:
                        done[info.name] = f"zeros (reset_parameters failed: {e})"
    return done


def strided(base: torch.Tensor, view: View) -> torch.Tensor:
    """``base``'s storage seen through ``view``."""
    return torch.as_strided(base, view.shape, view.stride, base.storage_offset() + view.offset)


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a flat ``uint8`` view."""
    flat = tensor.detach().reshape(-1) if tensor.dim() else tensor.detach().reshape(1)
    return flat.view(torch.uint8)


class ModelSink:
    """Writes into model tensors: fresh ones for meta parameters, else their own storage.

    Fresh tensors are installed only at :meth:`commit`, so a failed load leaves a meta
    model untouched.
    """

    def __init__(self, model: nn.Module, info: ModelInfo, missing: list[str], initialize: bool):
        self.model, self.info = model, info
        self.missing, self.initialize = missing, initialize
        self.results: dict[str, tuple[Destination, torch.Tensor]] = {}
        self.initialized: dict[str, str] = {}

    def open(self, dest: Destination) -> torch.Tensor:
        return destination_tensor(self.model, dest)

    def write_bytes(self, handle: torch.Tensor, dest: Destination, offset: int,
                    data: torch.Tensor) -> None:
        flat_bytes(handle)[offset:offset + data.numel()].copy_(data)

    def write_view(self, handle: torch.Tensor, dest: Destination, view: View,
                   src: torch.Tensor) -> None:
        with torch.no_grad():
            strided(handle, view).copy_(src.reshape(view.shape))

    def close(self, dest: Destination, handle: torch.Tensor) -> None:
        self.results[dest.key] = (dest, handle)

    def commit(self) -> None:
        if self.initialize:
            infos = [self.info.get(name) for name in self.missing]
            self.initialized = initialize_missing(self.model, infos)
        for dest, tensor in self.results.values():
            install(self.model, dest, tensor, self.info.get(dest.key))

    def abort(self) -> None:
        self.results.clear()
