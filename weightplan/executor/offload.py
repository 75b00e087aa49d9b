"""Disk offload: tensors of modules placed on ``"disk"`` are written to ``offload_folder``,
one safetensors file each, as soon as they are loaded, and not kept in the model (they stay
on meta; accelerate's hooks read them back at forward time, :mod:`weightplan.bridge.offload`).
"""

from __future__ import annotations

import os

import torch
from weightplan.errors import ExecutionError, SaveError
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.device import offload_file


def write_offloaded(folder: str, key: str, tensor: torch.Tensor) -> str:
    """Write ``tensor`` as ``key`` into its file under ``folder``; returns the path.

    Raises:
        ExecutionError: the folder can't be made or the file written (names both).
    """
    from weightplan.planner.write.shards import encode_header  # (only a load that offloads)

    path = offload_file(folder, key)
    tensor = tensor.detach().contiguous()
    header, _ = encode_header([(key, TensorSpec(tuple(tensor.shape), tensor.dtype))], {})
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "wb") as f:  # the header, then the bytes straight from the tensor
            f.write(header)
            f.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
    except (OSError, RuntimeError, ValueError, SaveError) as e:
        raise ExecutionError(f"offloading {key} to {path} failed: {e}") from e
    return path
