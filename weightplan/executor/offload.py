"""Disk offload: tensors of modules placed on ``"disk"`` are written to ``offload_folder``,
one safetensors file each (named by the tensor), and not kept in the model (they stay on
meta; accelerate's hooks read them back at forward time, :mod:`weightplan.bridge.offload`).

As the plan says (:mod:`~weightplan.planner.tensors.schedule.offload_plan`), a tensor is

- *streamed* (:class:`OffloadFile`): its file is made when its step starts (the header,
  then room for the bytes) and each direct read's bytes are written at their offset
  straight from the checkpoint's pages, from the reader threads: no host tensor;
- *staged* (:func:`write_offloaded`): assembled in host memory by its step, then written
  in one piece.

Nothing is fsync'ed: the folder is scratch for this process's hooks.
"""

from __future__ import annotations

import os

import torch

from weightplan.errors import ExecutionError, SaveError
from weightplan.planner.core.spec import TensorSpec
from weightplan.planner.inputs.device import offload_file


def _header(key: str, spec: TensorSpec) -> bytes:
    from weightplan.planner.write.shards import encode_header  # (only a load that offloads)

    return encode_header([(key, spec)], {})[0]


def write_offloaded(folder: str, key: str, tensor: torch.Tensor) -> str:
    """Write ``tensor`` as ``key`` into its file under ``folder``; returns the path.

    Raises:
        ExecutionError: the folder can't be made or the file written (names both).
    """
    path = offload_file(folder, key)
    tensor = tensor.detach().contiguous()
    try:
        header = _header(key, TensorSpec(tuple(tensor.shape), tensor.dtype))
        os.makedirs(folder, exist_ok=True)
        with open(path, "wb") as f:  # the header, then the bytes straight from the tensor
            f.write(header)
            f.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
    except (OSError, RuntimeError, ValueError, SaveError) as e:
        raise ExecutionError(f"offloading {key} to {path} failed: {e}") from e
    return path


class OffloadFile:
    """A streamed tensor's file, open for writing: its header written, its bytes written
    where each read lands (:meth:`write`, from any thread), closed by :meth:`close`."""

    def __init__(self, folder: str, key: str, spec: TensorSpec):
        self.key, self.path = key, offload_file(folder, key)
        try:
            header = _header(key, spec)
            os.makedirs(folder, exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                                           | getattr(os, "O_CLOEXEC", 0), 0o644)
        except (OSError, SaveError) as e:
            raise ExecutionError(f"offloading {key} to {self.path} failed: {e}") from e
        self.start = len(header)
        try:
            os.ftruncate(self._fd, self.start + spec.nbytes)
            self._pwrite(memoryview(header), 0)
        except BaseException:
            self.close()
            raise

    def region(self, offset: int) -> tuple[int, int, str]:
        """The open file, where byte ``offset`` of the tensor's data lies in it, its path."""
        assert self._fd is not None
        return self._fd, self.start + offset, self.path

    def write(self, offset: int, data: torch.Tensor) -> None:
        """Bytes ``data`` (a flat ``uint8`` tensor on the CPU) at byte ``offset`` of the
        tensor's data."""
        if data.numel():
            self._pwrite(data.detach().contiguous().numpy().data, self.start + offset)

    def _pwrite(self, buf: memoryview, at: int) -> None:
        fd = self._fd
        assert fd is not None
        done = 0
        try:
            while done < len(buf):
                done += os.pwrite(fd, buf[done:], at + done)
        except OSError as e:
            raise ExecutionError(f"offloading {self.key}: writing {self.path} at byte "
                                 f"{at + done} failed: {e}") from e

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
