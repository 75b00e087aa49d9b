"""The sink protocol: where the executor's writes go.

The executor calls, in this order (1-3 from reader threads, 4-6 from the main thread):

1. ``open(dest)`` when a step is submitted: a handle to write into;
2. ``write_bytes(handle, dest, byte_offset, data)``: a direct byte copy; or, for a file
   not in the page cache, ``byte_view(handle, dest, byte_offset, nbytes)``: the handle's
   own bytes for the reader to ``preadv`` into (``None``: no CPU bytes, so write_bytes);
   a direct read into a handle that is a file asks first ``file_region(handle, dest,
   byte_offset)``: ``(fd, file offset, path)`` where those bytes go, for the reader to copy
   file to file in the kernel (``None``: not a file);
3. ``write_view(handle, dest, view, src)``: a strided / casting copy;
4. ``update_view(handle, dest, view)`` (main thread, after the step's reads landed): the
   destination's own elements, for an op that updates them in place (a LoRA merge;
   ``None``: the sink keeps none, the update is dropped as its writes are);
5. ``close(dest, handle)`` when the step is finalized;
6. ``commit()`` after the last step, or ``abort()`` on any failure.

Implementations: :class:`~weightplan.executor.model_sink.ModelSink` (model tensors),
:class:`~weightplan.executor.writer.FileSink` (safetensors files) and
:class:`~weightplan.executor.dict_sink.DictSink` (a ``{key: tensor}`` dict).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View


class Sink(Protocol):
    def open(self, dest: Destination) -> Any: ...

    def write_bytes(self, handle: Any, dest: Destination, offset: int,
                    data: torch.Tensor) -> None: ...

    def byte_view(self, handle: Any, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None: ...

    def file_region(self, handle: Any, dest: Destination, offset: int
                    ) -> tuple[int, int, str] | None: ...

    def write_view(self, handle: Any, dest: Destination, view: View,
                   src: torch.Tensor) -> None: ...

    def update_view(self, handle: Any, dest: Destination,
                    view: View) -> torch.Tensor | None: ...

    def close(self, dest: Destination, handle: Any) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...
