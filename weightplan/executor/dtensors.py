"""Turning one rank's local tensor into the parameter the model holds.

``output="dtensor"``: ``DTensor.from_local`` on the plan's mesh with the destination's
placement and the *global* shape and stride (uneven shards report the right global size
on every rank, with no collective). ``output="local"``: the local tensor as it is.

A tensor the checkpoint lacks is initialized whole on every rank (the model's own init),
then made one tensor for the ranks (:func:`shard_initialized`): the mesh's first rank's
init is broadcast to the others (each rank's RNG differs: a router initialized on each
rank alone would route tokens differently on each), and each rank keeps its part of it,
placed as the plan places a loaded one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from weightplan.errors import ParallelError, RankFailedError
from weightplan.executor.init import module_and_attr
from weightplan.planner.core.geometry import row_major_strides
from weightplan.planner.core.sharding.placements import Placement
from weightplan.planner.tensors.ir.destination import Destination

if TYPE_CHECKING:
    from weightplan.planner.inputs.model_info import ModelInfo
    from weightplan.planner.tensors.ir.shard_nodes import Sharding


def as_model_tensor(local: torch.Tensor, dest: Destination, sharding: Sharding | None
                    ) -> torch.Tensor:
    """What the sink installs for ``dest``: a DTensor, or the tensor itself."""
    if sharding is None or dest.shard is None or sharding.output == "local":
        return local
    if sharding.mesh is None:
        raise ParallelError("output='dtensor' needs a DeviceMesh (a process group, or mesh=); "
                            "a dry run (world_size=, rank=) can produce output='local' only")
    return _dtensor(local, dest.shard.placement, dest.shard.global_shape, sharding.mesh)


def _dtensor(local: torch.Tensor, placement: Placement, shape: tuple[int, ...],
             mesh: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, mesh, [placement.to_torch()], run_check=False,
                              shape=torch.Size(shape), stride=row_major_strides(shape))


def shard_initialized(model: nn.Module, info: ModelInfo, names: list[str], sharding: Sharding
                      ) -> None:
    """The initialized parameters ``names`` (whole on every rank, the same order on every
    rank) made one tensor for the ranks and cut to this rank's part (see the module doc).

    Raises:
        RankFailedError: the process group broke during a broadcast.
    """
    from weightplan.planner.core.sharding.shard_math import slice_local

    for name in names:
        entry = info.get(name)
        if entry is None or entry.is_buffer:  # (a buffer: rebuilt alike on every rank)
            continue
        whole = _held(model, name)
        if sharding.mesh is not None:
            _from_first_rank(whole.data, sharding.mesh, name)
        placement = sharding.placement(name, whole.dim())
        if not placement.is_dtensor:
            continue
        local = slice_local(whole.data, placement, sharding.world_size, sharding.rank)
        if local.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr():
            local = local.clone()  # (a view: it kept the whole init alive on every rank)
        if sharding.output == "dtensor" and sharding.mesh is not None:
            local = _dtensor(local, placement, tuple(whole.shape), sharding.mesh)
        value = nn.Parameter(local, requires_grad=whole.requires_grad)
        for alias in entry.aliases:  # (every name of a tied tensor)
            module, attr = module_and_attr(model, alias)
            module._parameters[attr] = value


def _held(model: nn.Module, name: str) -> nn.Parameter:
    module, attr = module_and_attr(model, name)
    tensor = module._parameters[attr]
    assert tensor is not None
    return tensor


def _from_first_rank(tensor: torch.Tensor, mesh: Any, name: str) -> None:
    import torch.distributed as dist

    group = mesh.get_group()
    try:
        dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group)
    except RuntimeError as e:
        raise RankFailedError(f"{name}: initialized (the checkpoint lacks it), its broadcast "
                              "from the mesh's first rank failed: a rank left the process "
                              f"group? {type(e).__name__}: {e}") from e


def check_output(sharding: Sharding | None) -> None:
    """Fail before any byte is read when DTensors are asked for without a mesh."""
    if sharding is not None and sharding.output == "dtensor" and sharding.mesh is None:
        raise ParallelError("output='dtensor' needs a DeviceMesh (a process group, or mesh=); "
                            "a dry run (world_size=, rank=) can produce output='local' only: "
                            "pass TensorParallel(..., output='local')")
