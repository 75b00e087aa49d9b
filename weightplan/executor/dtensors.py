"""Turning one rank's local tensor into the parameter the model holds.

``output="dtensor"``: ``DTensor.from_local`` on the plan's mesh with the destination's
placement and the *global* shape and stride (uneven shards report the right global size
on every rank, with no collective). ``output="local"``: the local tensor as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from weightplan.errors import ParallelError
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import row_major_strides

if TYPE_CHECKING:
    from weightplan.planner.tensors.ir.shard_nodes import Sharding


def as_model_tensor(local: torch.Tensor, dest: Destination, sharding: Sharding | None
                    ) -> torch.Tensor:
    """What the sink installs for ``dest``: a DTensor, or the tensor itself."""
    if sharding is None or dest.shard is None or sharding.output == "local":
        return local
    if sharding.mesh is None:
        raise ParallelError("output='dtensor' needs a DeviceMesh (a process group, or mesh=); "
                            "a dry run (world_size=, rank=) can produce output='local' only")
    from torch.distributed.tensor import DTensor

    shape = dest.shard.global_shape
    return DTensor.from_local(local, sharding.mesh, [dest.shard.placement.to_torch()],
                              run_check=False, shape=torch.Size(shape),
                              stride=row_major_strides(shape))


def check_output(sharding: Sharding | None) -> None:
    """Fail before any byte is read when DTensors are asked for without a mesh."""
    if sharding is not None and sharding.output == "dtensor" and sharding.mesh is None:
        raise ParallelError("output='dtensor' needs a DeviceMesh (a process group, or mesh=); "
                            "a dry run (world_size=, rank=) can produce output='local' only: "
                            "pass TensorParallel(..., output='local')")
