"""Copies from host memory to a CUDA device through pinned staging buffers.

A reader thread copies the bytes it read (a mapped file window) into a free pinned buffer,
queues a non-blocking copy to the device on a copy stream and goes on reading: the
device copy overlaps the next reads. A buffer is reused once its copy's event completed;
:meth:`Stager.finish` waits for every queued copy. Host staging is at most the plan's
pool (:func:`~weightplan.planner.tensors.schedule.device_plan.staging_of`: ``buffers`` ×
``chunk`` bytes, never more than the bytes moved), allocated as the copies need buffers;
device bytes are the destination tensors.
"""

from __future__ import annotations

import threading

import torch

from weightplan.planner.inputs.device import StagingPool


class Stager:
    """Pinned buffers, a copy stream per device, one event per buffer in flight."""

    def __init__(self, pool: StagingPool):
        self.chunk, self.count = max(1, pool.chunk), max(1, pool.buffers)
        self._free: list[torch.Tensor] = []
        self._busy: list[tuple[torch.cuda.Event, torch.Tensor]] = []
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._lock = threading.Condition()
        self.staged_bytes = 0  # host bytes pinned for staging (reported)

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        with self._lock:
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device=device)
            return self._streams[device]

    def _acquire(self) -> torch.Tensor:
        with self._lock:
            while True:
                if self._free:
                    return self._free.pop()
                if len(self._free) + len(self._busy) < self.count:
                    self.staged_bytes += self.chunk
                    return torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True)
                event, buffer = self._busy.pop(0)
                event.synchronize()
                return buffer

    def copy_bytes(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst[:] = src`` for flat ``uint8`` tensors, ``dst`` on CUDA, ``src`` on the host."""
        stream = self._stream(dst.device)
        stream.wait_stream(torch.cuda.default_stream(dst.device))  # dst was allocated there
        for start in range(0, src.numel(), self.chunk):
            n = min(self.chunk, src.numel() - start)
            buffer = self._acquire()
            buffer[:n].copy_(src[start:start + n])
            with torch.cuda.stream(stream):
                dst[start:start + n].copy_(buffer[:n], non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            with self._lock:
                self._busy.append((event, buffer))

    def copy_view(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)`` for a strided / casting copy: staged contiguous, then copied
        (cast) on the device, in order on the same stream."""
        flat = src.detach().contiguous().reshape(-1)
        staged = torch.empty(flat.numel(), dtype=flat.dtype, device=dst.device)
        self.copy_bytes(staged.view(torch.uint8), flat.view(torch.uint8))
        stream = self._stream(dst.device)
        with torch.cuda.stream(stream):
            dst.copy_(staged.view(dst.shape))
        staged.record_stream(stream)  # not reused before the copy ran

    def finish(self) -> None:
        """Wait for every queued copy; the buffers become free again."""
        with self._lock:
            busy, self._busy = self._busy, []
            streams = list(self._streams.values())
        for event, buffer in busy:
            event.synchronize()
            with self._lock:
                self._free.append(buffer)
        for stream in streams:
            stream.synchronize()
