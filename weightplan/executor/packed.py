"""The packed dequantize read: a stored weight's parts, decoded into the destination.

A packed dequantize node's read task reads, of its stored weight and each part, the box
its layout names (a rank's slice: the rows' bytes in one mapped window, or a column
slice's runs; the scale tiles over them), and decodes those boxes as a small packed
weight of their own, writing the region it lands in chunk by chunk through the sink (an
fp32 workspace of at most ``CHUNK_BYTES``, the reader thread's own, reused read after
read); an input of materialized ops, or a reshaped
landing, gets a fresh dequantized tensor of the region (counted as the task's temporary).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from weightplan.executor.strided_read import read_runs
from weightplan.planner.core.geometry import Region, View, row_major_strides
from weightplan.planner.core.quant.formats import Scheme, Workspace, region_chunks
from weightplan.planner.core.quant.packed_slices import PackedCover
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.lower.packed_reads import PartRead
from weightplan.planner.tensors.lower.placement import ReadTask, Step


def packed_read(run: Any, program: Step, step: Any, task: ReadTask) -> None:
    """Dequantize the task's region of its packed weight into its fragment (or hold it)."""
    attrs, packed = task.dequantize, task.layout.packed
    assert attrs is not None and isinstance(attrs.scheme, Scheme) and packed is not None
    entries = [n.attrs.entry for n in task.node.inputs]  # type: ignore[union-attr]
    run.tracker.add(task.layout.window_bytes)
    try:
        with contextlib.ExitStack() as stack:
            parts = [_part(run, stack, e, r) for e, r in zip(entries, packed.parts, strict=True)]
            _decode_into(run, program, step, task, attrs.scheme, parts, packed.cover)
    finally:
        run.tracker.sub(task.layout.window_bytes)


def _part(run: Any, stack: contextlib.ExitStack, entry: TensorEntry, read: PartRead
          ) -> torch.Tensor:
    """The box of a stored part its read names, as a tensor of the box's shape (a view of
    a mapped window, or its runs read into a buffer)."""
    shape = tuple(entry.spec.shape)
    box = read.box if read.box is not None else Region.full(shape)
    if entry.file is None:
        assert run.checkpoint.tensors is not None
        whole = run.checkpoint.tensors[entry.key]
        return whole[tuple(slice(a, b) for a, b in zip(box.starts, box.stops, strict=True))]
    if read.runs is not None:
        buffer = torch.empty(read.runs.nbytes, dtype=torch.uint8)
        read_runs(run.reader, entry.file, entry.offset, read.runs, buffer)
        return buffer.view(entry.spec.dtype).view(box.shape)
    raw = stack.enter_context(run.reader.window(entry.file, entry.offset + read.first,
                                                read.length))
    return raw.view(entry.spec.dtype).as_strided(box.shape, row_major_strides(shape))


def _decode_into(run: Any, program: Step, step: Any, task: ReadTask, scheme: Scheme,
                 parts: list[torch.Tensor], cover: PackedCover) -> None:
    region, f = task.region, task.fragment
    local = cover.local(region)  # (the parts are the cover's boxes: a weight of its shape)
    dtype = task.node.spec.dtype
    whole = f is None or tuple(f.view.shape) != tuple(region.shape)
    out = torch.empty(region.shape, dtype=dtype) if whole else None
    if whole:
        run.tracker.add(region.numel * dtype.itemsize)
    chunks = region_chunks(scheme, parts, cover.box.shape, local.starts, local.stops,
                           workspace=_thread_workspace(run))
    for idx, (a, b), (c, d), x in chunks:
        if out is not None:
            out[idx][a:b, c:d].copy_(x)
            continue
        assert f is not None
        v = f.view
        offset = v.offset + sum(i * s for i, s in zip(idx, v.stride, strict=False)) \
            + a * v.stride[-2] + c * v.stride[-1]
        run.sink.write_view(step.handles[f.target], program.destinations[f.target],
                            View((b - a, d - c), tuple(v.stride[-2:]), offset), x)
    if out is None:
        return
    if f is None:
        step.held[task.source] = out  # (its bytes stay counted until the ops ran)
        return
    run.sink.write_view(step.handles[f.target], program.destinations[f.target], f.view, out)
    run.tracker.sub(region.numel * dtype.itemsize)


def _thread_workspace(run: Any) -> Workspace:
    """This reader thread's decode workspace, reused read after read (see
    :class:`~weightplan.planner.core.quant.formats.Workspace`)."""
    held = getattr(run.local, "packed_workspace", None)
    if held is None:
        held = run.local.packed_workspace = Workspace()
    return held
