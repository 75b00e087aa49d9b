"""Disk offload: tensors of modules placed on ``"disk"`` are written to ``offload_folder``,
one safetensors file each, as soon as they are loaded, and not kept in the model (they stay
on meta; accelerate's hooks read them back at forward time, :mod:`weightplan.bridge.offload`).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

from weightplan.errors import ExecutionError
from weightplan.planner.inputs.device import offload_file


def write_offloaded(folder: str, key: str, tensor: torch.Tensor) -> str:
    """Write ``tensor`` as ``key`` into its file under ``folder``; returns the path.

    Raises:
        ExecutionError: the folder can't be made or the file written (names both).
    """
    path = offload_file(folder, key)
    try:
        os.makedirs(folder, exist_ok=True)
        save_file({key: tensor.detach().contiguous()}, path)
    except (OSError, RuntimeError, ValueError) as e:
        raise ExecutionError(f"offloading {key} to {path} failed: {e}") from e
    return path
