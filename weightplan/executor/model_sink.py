"""The load sink: destination tensors of a model, and putting loaded tensors into it.

It follows the :class:`~weightplan.executor.sink.Sink` protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from weightplan.errors import ExecutionError, PlanError
from weightplan.planner.inputs.device import DeviceMap, StagingPool
from weightplan.executor.init import initialize_fresh, module_and_attr
from weightplan.planner.inputs.model_info import ModelInfo, ModelTensor
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View

if TYPE_CHECKING:
    from weightplan.executor.offload import OffloadFile
    from weightplan.executor.staging import Stager
    from weightplan.planner.tensors.schedule.offload_plan import OffloadPlan
    from weightplan.planner.tensors.ir.shard_nodes import Sharding


def current_tensor(model: nn.Module, name: str) -> torch.Tensor:
    module, attr = module_and_attr(model, name)
    tensor: torch.Tensor | None = module._parameters.get(attr)
    if tensor is None:
        tensor = module._buffers.get(attr)
    if tensor is None:
        raise PlanError(f"the model has no tensor {name} any more; call explain() again")
    return tensor


def destination_tensor(model: nn.Module, dest: Destination,
                       devices: DeviceMap | None = None) -> torch.Tensor:
    """A fresh tensor for an allocating destination (on its device), else the model's own
    storage."""
    if dest.allocates:
        device = devices.device_for(dest.key) if devices is not None else None
        return torch.empty(dest.spec.shape, dtype=dest.spec.dtype, device=device)
    return current_tensor(model, dest.key).detach()


def install(model: nn.Module, dest: Destination, tensor: torch.Tensor, info: ModelTensor | None,
            sharding: Sharding | None = None) -> None:
    """Put an allocated tensor into the model under every alias (tied tensors stay tied);
    under tensor parallel, as a DTensor when the plan asks for one."""
    if not dest.allocates:
        return
    if sharding is not None:  # (tensor parallel: its module only then)
        from weightplan.executor.dtensors import as_model_tensor

        tensor = as_model_tensor(tensor, dest, sharding)
    is_buffer = info is not None and info.is_buffer
    if is_buffer:
        value: torch.Tensor = tensor
    else:
        grad = (info.requires_grad if info is not None else True) and tensor.is_floating_point()
        value = nn.Parameter(tensor, requires_grad=grad)
    _set(model, dest.aliases, value, is_buffer)


def on_meta_as(model: nn.Module, aliases: tuple[str, ...], dtype: torch.dtype) -> None:
    """An offloaded parameter left on meta in the plan's dtype, as a resident one is
    installed (accelerate's hooks cast what they read back to the parameter's dtype)."""
    tensor = current_tensor(model, aliases[0])
    if tensor.dtype == dtype:
        return
    value = nn.Parameter(torch.empty(tensor.shape, dtype=dtype, device="meta"),
                         requires_grad=tensor.requires_grad and dtype.is_floating_point)
    _set(model, aliases, value, False)


def _set(model: nn.Module, aliases: tuple[str, ...], value: torch.Tensor,
         is_buffer: bool) -> None:
    """``value`` as the buffer (or parameter) of every name in ``aliases``."""
    for alias in aliases:
        module, attr = module_and_attr(model, alias)
        if is_buffer:
            module._buffers[attr] = value
        else:
            assert isinstance(value, nn.Parameter)
            module._parameters[attr] = value


def strided(base: torch.Tensor, view: View) -> torch.Tensor:
    """``base``'s storage seen through ``view``."""
    return torch.as_strided(base, view.shape, view.stride, base.storage_offset() + view.offset)


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a flat ``uint8`` view."""
    flat = tensor.detach().reshape(-1) if tensor.dim() else tensor.detach().reshape(1)
    return flat.view(torch.uint8)


def _stager(pool: StagingPool) -> Stager:
    """Pinned staging buffers, for a load onto CUDA devices (their module imported then)."""
    from weightplan.executor.staging import Stager

    return Stager(pool)


class ModelSink:
    """Writes into model tensors: fresh ones for meta parameters, else their own storage.

    Fresh tensors are installed only at :meth:`commit`, so a failed load leaves a meta
    model untouched.
    """

    def __init__(self, model: nn.Module, info: ModelInfo, missing: list[str], initialize: bool,
                 dtype: torch.dtype | None = None, devices: DeviceMap | None = None,
                 sharding: Sharding | None = None, offload: OffloadPlan | None = None,
                 staging: StagingPool | None = None):
        self.model, self.info, self.dtype, self.devices = model, info, dtype, devices
        self.offload = offload  # the disk's tensors: referenced in place, streamed or staged
        self.streamed = offload.streamed_names() if offload is not None else frozenset()
        self.streaming: dict[str, OffloadFile] = {}  # streamed files open, by tensor
        self.sharding = sharding
        self.stager = _stager(staging) if staging is not None and staging.nbytes \
            and devices is not None and devices.uses_cuda else None  # the plan's pool
        self.missing, self.initialize = missing, initialize
        self.results: dict[str, tuple[Destination, torch.Tensor]] = {}
        self.initialized: dict[str, str] = {}
        self.offloaded: dict[str, str] = {}  # name (every alias) → its file on the disk
        self.disk_bytes = 0  # bytes written to the offload folder

    def open(self, dest: Destination) -> torch.Tensor | OffloadFile:
        if dest.allocates and dest.key in self.streamed and self._to_disk(dest.key):
            assert self.devices is not None and self.devices.offload_folder is not None
            from weightplan.executor.offload import OffloadFile  # (disk offload only)

            handle = self.streaming[dest.key] = OffloadFile(self.devices.offload_folder,
                                                            dest.key, dest.spec)
            return handle  # streamed: each read's bytes straight into the file
        return destination_tensor(self.model, dest, self.devices)

    def write_bytes(self, handle: torch.Tensor | OffloadFile, dest: Destination, offset: int,
                    data: torch.Tensor) -> None:
        if not isinstance(handle, torch.Tensor):
            handle.write(offset, data)
            return
        target = flat_bytes(handle)[offset:offset + data.numel()]
        if handle.is_cuda and self.stager is not None:  # pinned staging, non-blocking
            self.stager.copy_bytes(target, data)
        else:
            target.copy_(data)

    def byte_view(self, handle: torch.Tensor | OffloadFile, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        """Bytes ``[offset, offset + nbytes)`` of ``handle`` to read a file into, when it
        lives in CPU memory (else ``None``: the reader copies out of a window)."""
        if not isinstance(handle, torch.Tensor) or handle.device.type != "cpu":
            return None
        return flat_bytes(handle)[offset:offset + nbytes]

    def file_region(self, handle: torch.Tensor | OffloadFile, dest: Destination,
                    offset: int) -> tuple[int, int, str] | None:
        """A streamed tensor's file: where byte ``offset`` of it goes (else ``None``)."""
        return None if isinstance(handle, torch.Tensor) else handle.region(offset)

    def write_view(self, handle: torch.Tensor | OffloadFile, dest: Destination, view: View,
                   src: torch.Tensor) -> None:
        if not isinstance(handle, torch.Tensor):  # (the plan streams only direct copies)
            raise ExecutionError(f"{dest.key}: planned as streamed to the disk (direct "
                                 "copies only), but a strided write came")
        with torch.no_grad():
            if handle.is_cuda and self.stager is not None:
                self.stager.copy_view(strided(handle, view), src.reshape(view.shape))
            else:
                strided(handle, view).copy_(src.reshape(view.shape))

    def update_view(self, handle: torch.Tensor, dest: Destination,
                    view: View) -> torch.Tensor:
        """``handle`` through ``view``, every copy queued into it landed (a CUDA device's
        staged copies run on their own stream)."""
        if handle.is_cuda and self.stager is not None:
            self.stager.finish()
        return strided(handle, view)

    def close(self, dest: Destination, handle: torch.Tensor | OffloadFile) -> None:
        if not isinstance(handle, torch.Tensor):  # streamed: every byte is in its file
            handle.close()
            del self.streaming[dest.key]
            self._offloaded(dest.key, dest.aliases, handle.path, dest.spec.nbytes)
            return
        if self._to_disk(dest.key):  # written now, never kept (the model's stays on meta)
            self._offload(dest.key, dest.aliases, handle)
            return
        self.results[dest.key] = (dest, handle)

    def _to_disk(self, name: str) -> bool:
        info = self.info.get(name)
        return (self.devices is not None and self.devices.offload_folder is not None
                and self.devices.offloads(name) and not (info is not None and info.is_buffer))

    def _offload(self, key: str, aliases: tuple[str, ...], tensor: torch.Tensor) -> None:
        assert self.devices is not None and self.devices.offload_folder is not None
        from weightplan.executor.offload import write_offloaded  # (disk offload only)

        path = write_offloaded(self.devices.offload_folder, key, tensor)
        self._offloaded(key, aliases, path, tensor.nbytes)

    def _offloaded(self, key: str, aliases: tuple[str, ...], path: str, nbytes: int) -> None:
        self.disk_bytes += nbytes
        for alias in aliases or (key,):
            self.offloaded[alias] = path

    def commit(self) -> None:
        # before installing: loaded tensors are still on meta, so the init can't touch them
        if self.stager is not None:
            self.stager.finish()  # every device copy landed before the model sees it
        names = self.missing if self.initialize else []
        self.initialized = initialize_fresh(self.model, self.info, names, dtype=self.dtype,
                                            devices=self.devices)
        if self.sharding is not None and self.initialized:  # (one tensor for the ranks)
            from weightplan.executor.dtensors import shard_initialized

            shard_initialized(self.model, self.info, sorted(self.initialized), self.sharding)
        for name in [n for n in self.initialized if self._to_disk(n)]:  # (fresh ones too)
            tensor = current_tensor(self.model, name)
            info = self.info.get(name)
            self._offload(name, info.aliases if info is not None else (name,), tensor)
            module, attr = module_and_attr(self.model, name)
            module._parameters[attr] = nn.Parameter(tensor.to("meta"),
                                                    requires_grad=tensor.requires_grad)
        for dest, tensor in self.results.values():
            install(self.model, dest, tensor, self.info.get(dest.key), self.sharding)
        for t in self.offload.tensors if self.offload is not None else ():
            on_meta_as(self.model, t.aliases or (t.name,), t.dtype)

    def device_bytes(self) -> dict[str, int]:
        """Bytes the load put on each device (``"disk"``: written to the offload folder)."""
        per: dict[str, int] = {}
        for _, tensor in self.results.values():
            per[str(tensor.device)] = per.get(str(tensor.device), 0) + tensor.nbytes
        if self.disk_bytes:
            per["disk"] = self.disk_bytes
        return per

    @property
    def staging_bytes(self) -> int:
        """Pinned host memory the device copies went through."""
        return self.stager.staged_bytes if self.stager is not None else 0

    def abort(self) -> None:
        if self.stager is not None:
            self.stager.finish()
        for handle in self.streaming.values():
            handle.close()
        self.streaming.clear()
        self.results.clear()
