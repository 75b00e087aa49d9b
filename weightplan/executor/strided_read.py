"""Strided reads: only the byte runs of a region (a rank's column slice), never its span.

A read whose layout carries runs (:mod:`~weightplan.planner.tensors.lower.strided`) reads
them with one ``preadv`` each: straight into the destination when the region lands in a
contiguous view of the checkpoint's dtype (a rank's ``[rows, cols / N]`` shard: the runs
are its rows, back to back), else into a buffer of the region's size that is then cast,
placed or dequantized like a mapped window's bytes.
"""

from __future__ import annotations

from typing import Any

import torch

from weightplan.planner.core.geometry import _is_contiguous
from weightplan.planner.tensors.lower.placement import ReadTask, Step
from weightplan.planner.tensors.lower.strided import ByteRuns


def read_runs(reader: Any, file: str, base: int, runs: ByteRuns, dest: torch.Tensor) -> None:
    """The runs of the tensor at ``base`` of ``file``, back to back into ``dest``."""
    reader.read_runs(file, (runs.offsets() + base).tolist(), runs.run, dest)


def runs_straight(run: Any, program: Step, step: Any, task: ReadTask) -> bool:
    """Read a strided task's runs straight into its contiguous fragment of the same dtype;
    False when it lands otherwise (a cast, a strided view, a dequantize, held for ops)."""
    f, entry, runs = task.fragment, task.entry, task.layout.runs
    if f is None or runs is None or task.dequantize is not None or entry.file is None:
        return False
    dest = program.destinations[f.target]
    if dest.spec.dtype != entry.spec.dtype or not _is_contiguous(f.view.shape, f.view.stride):
        return False
    offset = f.view.offset * dest.spec.dtype.itemsize
    handle = step.handles[f.target]
    target = run.sink.byte_view(handle, dest, offset, runs.nbytes)
    if target is not None:
        read_runs(run.reader, entry.file, entry.offset, runs, target)
        return True
    buffer = torch.empty(runs.nbytes, dtype=torch.uint8)
    read_runs(run.reader, entry.file, entry.offset, runs, buffer)
    run.sink.write_bytes(handle, dest, offset, buffer)
    return True


def runs_region(reader: Any, task: ReadTask) -> torch.Tensor:
    """A strided task's region, read run by run into a fresh tensor of its shape."""
    entry, runs = task.entry, task.layout.runs
    assert runs is not None and entry.file is not None
    buffer = torch.empty(runs.nbytes, dtype=torch.uint8)
    read_runs(reader, entry.file, entry.offset, runs, buffer)
    return buffer.view(entry.spec.dtype).view(task.region.shape)
