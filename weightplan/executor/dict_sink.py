"""The in-memory sink: fresh tensors collected into a dict (``convert`` / ``revert``)."""

from __future__ import annotations

import torch

from weightplan.executor.model_sink import flat_bytes, strided
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View


class DictSink:
    """Allocates every destination and, at :meth:`commit`, hands them over in ``results``
    (in the order the steps finished)."""

    def __init__(self) -> None:
        self._done: dict[str, torch.Tensor] = {}
        self.results: dict[str, torch.Tensor] = {}

    def open(self, dest: Destination) -> torch.Tensor:
        return torch.empty(dest.spec.shape, dtype=dest.spec.dtype)

    def write_bytes(self, handle: torch.Tensor, dest: Destination, offset: int,
                    data: torch.Tensor) -> None:
        flat_bytes(handle)[offset:offset + data.numel()].copy_(data)

    def byte_view(self, handle: torch.Tensor, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        return flat_bytes(handle)[offset:offset + nbytes]

    def file_region(self, handle: torch.Tensor, dest: Destination, offset: int
                    ) -> tuple[int, int, str] | None:
        return None

    def write_view(self, handle: torch.Tensor, dest: Destination, view: View,
                   src: torch.Tensor) -> None:
        with torch.no_grad():
            strided(handle, view).copy_(src.reshape(view.shape))

    def update_view(self, handle: torch.Tensor, dest: Destination,
                    view: View) -> torch.Tensor:
        return strided(handle, view)

    def close(self, dest: Destination, handle: torch.Tensor) -> None:
        self._done[dest.key] = handle

    def commit(self) -> None:
        self.results = self._done

    def abort(self) -> None:
        self._done = {}
