"""The dequantize read: FP8 bytes from a mapped window, scaled into their destination.

A dequantize node's read task maps its weight region like any read, reads the (small)
scale tensor, and writes ``q.float() · s`` into the destination view one row chunk at a
time through the sink (an fp32 workspace of at most ``CHUNK_BYTES``): no full-size fp32
temporary and no FP8 copy. An input of materialized ops gets a fresh dequantized tensor. A destination the plan
dequantizes on its device (``Step.device_dequantize``, see
:mod:`~weightplan.planner.tensors.schedule.dequant_side`) gets the FP8 bytes and scale
tiles copied there and dequantized by the device straight into its view
(:func:`dequantize_on_device`).
"""

from __future__ import annotations

from typing import Any

import torch

from weightplan.errors import QuantizationError
from weightplan.executor.sink import Sink
from weightplan.executor.strided_read import read_runs

from weightplan.planner.core.quant.blocks import (
    dequantize_chunks, dequantize_into, rows_per_chunk, workspace,
)
from weightplan.planner.core.quant.quantize import quantize
from weightplan.planner.tensors.lower.quant_steps import QuantizeTask
from weightplan.planner.core.geometry import View, row_major_strides
from weightplan.planner.core.sharding.fp8_slices import tile_frame
from weightplan.planner.core.ops.base import Streams
from weightplan.planner.tensors.lower.placement import ReadTask, Step


def dequantize_read(run: Any, program: Step, step: Any, task: ReadTask, src: torch.Tensor) -> None:
    """Dequantize ``src`` (the task's FP8 region) into the task's fragment (or hold it)."""
    attrs = task.dequantize
    assert attrs is not None
    scale, origin, full = _scale(run, task)
    f = task.fragment
    run.tracker.add(task.work_bytes)
    try:
        if f is not None and f.target in program.device_dequantize:
            base = step.handles[f.target]  # (a fresh tensor: the plan sides only those)
            target = base.as_strided(f.view.shape, f.view.stride,
                                     base.storage_offset() + f.view.offset)
            dequantize_on_device(src, scale, target, attrs.block, origin, full)
            return
        if f is None or tuple(f.view.shape) != tuple(task.region.shape):
            out = torch.empty(task.region.shape, dtype=attrs.dtype)
            dequantize_into(src, scale, out, attrs.block, origin=origin, full_shape=full)
            if f is None:
                run.tracker.add(task.tmp_bytes)
                step.held[task.source] = out
                return
            run.sink.write_view(step.handles[f.target], program.destinations[f.target], f.view, out)
            return
        dest, handle = program.destinations[f.target], step.handles[f.target]
        chunks = dequantize_chunks(src, scale, attrs.block, origin, full_shape=full,
                                   buffers=_thread_workspace(run, task))
        for idx, r0, r1, x in chunks:
            run.sink.write_view(handle, dest, rows_of(f.view, idx, r0, r1), x)
    finally:
        run.tracker.sub(task.work_bytes)


def dequantize_on_device(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
                         block: tuple[int, ...] | None, origin: tuple[int, ...],
                         full_shape: tuple[int, ...]) -> None:
    """The device side: ``q`` (FP8, host) and its scale tiles copied to ``out``'s device,
    widened and scaled there in row chunks straight into ``out`` (any view of ``q``'s
    shape). With ``out`` in host memory the same code runs on the CPU."""
    device = out.device
    dequantize_into(q.to(device), scale.to(device), out, block, origin=origin,
                    full_shape=full_shape)


def _thread_workspace(run: Any, task: ReadTask) -> tuple[torch.Tensor, torch.Tensor]:
    """This reader thread's workspace, grown as needed and reused: allocating a fresh one
    per read leaves the allocator's per-thread arenas holding tens of MiB."""
    assert task.dequantize is not None
    size = rows_per_chunk(task.region.shape, task.dequantize.block) * task.region.shape[-1]
    held = getattr(run.local, "workspace", None)
    if held is None or held[0].numel() < size:
        held = run.local.workspace = workspace(size)
    return held


def rows_of(view: View, index: tuple[int, ...], r0: int, r1: int) -> View:
    """Rows ``[r0, r1)`` of matrix ``index`` of a ``[..., R, C]`` view."""
    offset = view.offset + sum(i * s for i, s in zip(index, view.stride, strict=False)) + r0 * view.stride[-2]
    return View((r1 - r0, view.shape[-1]), tuple(view.stride[-2:]), offset)


def _scale(run: Any, task: ReadTask
           ) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """The scale tiles covering the task's region (only those: a rank's slice of a weight
    reads its own tiles), with the ``(origin, full_shape)`` frame to dequantize against
    them; a per-tensor scale is read whole with the weight's own frame."""
    entry, tiles = task.scale, task.scale_region
    assert entry is not None and tiles is not None
    shape = tuple(entry.spec.shape)
    if entry.file is None:
        assert run.checkpoint.tensors is not None
        whole = run.checkpoint.tensors[entry.key]
        scale = whole[tuple(slice(a, b) for a, b in zip(tiles.starts, tiles.stops, strict=True))]
    elif task.layout.scale_runs is not None:  # only the tiles' runs (a column slice's)
        scale = torch.empty(task.layout.scale_runs.nbytes, dtype=torch.uint8)
        read_runs(run.reader, entry.file, entry.offset, task.layout.scale_runs, scale)
        scale = scale.view(entry.spec.dtype).view(tiles.shape)
    else:
        first, count = tiles.element_span(shape)
        size = entry.spec.dtype.itemsize
        with run.reader.window(entry.file, entry.offset + first * size, count * size) as raw:
            flat = raw.view(entry.spec.dtype)
            scale = flat.as_strided(tiles.shape, row_major_strides(shape)).clone()
    if tiles.is_full(shape):
        return scale, task.region.starts, tuple(task.entry.spec.shape)
    assert task.dequantize is not None
    origin, full = tile_frame(task.region, tiles, task.dequantize.block)
    return scale, origin, full


def quantize_write(sink: Sink, program: Step, handles: list[Any], task: QuantizeTask,
                   streams: Streams[torch.Tensor]) -> None:
    """Quantize a materialized value (transformers' formula, edge tiles zero-padded) and
    write the FP8 weight and its scale into their destinations."""
    i, j = task.position
    value = streams[i][j]
    try:
        q, s = quantize(value, tuple(task.block), scale_fmt=task.scale_fmt)
    except QuantizationError as e:  # (an exact re-encode's tile: name the tensor and file)
        key = program.destinations[task.weight].key if task.weight is not None else None
        file = next((r.entry.file for r in program.reads if r.entry.file), None)
        raise QuantizationError(str(e), key=key, file=file) from e
    for index, tensor in ((task.weight, q), (task.scale, s)):
        if index is None:
            continue
        dest = program.destinations[index]
        sink.write_view(handles[index], dest, View(dest.spec.shape, dest.stride), tensor)
