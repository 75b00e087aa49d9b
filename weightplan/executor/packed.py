"""The packed dequantize read: a stored weight's parts, decoded into the destination.

A packed dequantize node's read task reads, of its stored weight and each part, the box
its layout names (a rank's slice: the rows' bytes in one mapped window, or a column
slice's runs; the scale tiles over them), and decodes those boxes as a small packed
weight of their own, one leading index (expert) at a time, each index's boxes mapped only
while it is decoded, writing the region it lands in chunk by chunk through the sink (an
fp32 workspace of at most ``CHUNK_BYTES``, the reader thread's own, reused read after
read); an input of materialized ops, or a reshaped
landing, gets a fresh dequantized tensor of the region (counted as the task's temporary).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import torch

from weightplan.executor.strided_read import read_runs
from weightplan.planner.core.geometry import Region, View, row_major_strides
from weightplan.planner.core.quant.formats import Scheme, Workspace, region_chunks
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.lower.packed_reads import PackedRead, PartRead, lead_span
from weightplan.planner.tensors.lower.placement import ReadTask, Step


def packed_read(run: Any, program: Step, step: Any, task: ReadTask) -> None:
    """Dequantize the task's region of its packed weight into its fragment (or hold it)."""
    attrs, packed = task.dequantize, task.layout.packed
    assert attrs is not None and isinstance(attrs.scheme, Scheme) and packed is not None
    entries = [n.attrs.entry for n in task.node.inputs]  # type: ignore[union-attr]
    run.tracker.add(task.layout.window_bytes)
    try:
        with contextlib.ExitStack() as stack:
            once = [None if cut and e.file is not None and r.runs is None else _part(run, stack, e, r)
                    for e, r, cut in zip(entries, packed.parts, packed.by_lead, strict=True)]
            _decode_into(run, program, step, task, attrs.scheme, packed, entries, once)
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
    return _mapped(run, stack, entry, read.first, read.length, box.shape)


def _mapped(run: Any, stack: contextlib.ExitStack, entry: TensorEntry, first: int,
            length: int, shape: tuple[int, ...]) -> torch.Tensor:
    """``shape`` elements of a stored part from byte ``first`` on, in a window mapped until
    ``stack`` closes (the pages leave the process's memory with it)."""
    raw = stack.enter_context(run.reader.window(entry.file, entry.offset + first, length))
    return raw.view(entry.spec.dtype).as_strided(shape, row_major_strides(tuple(entry.spec.shape)))


def _lead_parts(run: Any, stack: contextlib.ExitStack, packed: PackedRead,
                entries: list[TensorEntry], once: list[torch.Tensor | None],
                at: tuple[int, ...]) -> list[torch.Tensor]:
    """Each part at leading index ``at`` (the stored tensors' own): a part cut per index
    is mapped for it alone (or viewed, when read whole already); the others as read."""
    n, parts = len(at), []
    for e, r, cut, t in zip(entries, packed.parts, packed.by_lead, once, strict=True):
        if not cut:
            assert t is not None  # (read once, whole)
            parts.append(t)
            continue
        shape = tuple(e.spec.shape)
        box = r.box if r.box is not None else Region.full(shape)
        if t is not None:
            parts.append(t[tuple(slice(i - a, i - a + 1) for i, a in zip(at, box.starts, strict=False))])
            continue
        first, count = lead_span(r, shape, n, at)
        size = e.spec.dtype.itemsize
        sub = (1,) * n + box.shape[n:]
        parts.append(_mapped(run, stack, e, first * size, count * size, sub))
    return parts


def _decode_into(run: Any, program: Step, step: Any, task: ReadTask, scheme: Scheme,
                 packed: PackedRead, entries: list[TensorEntry],
                 once: list[torch.Tensor | None]) -> None:
    """Decode the region one leading index (expert) at a time, each index's parts mapped
    only while it is decoded (the parts are the cover's boxes: a weight of its shape)."""
    region, f, cover = task.region, task.fragment, packed.cover
    local = cover.local(region)
    dtype = task.node.spec.dtype
    whole = f is None or tuple(f.view.shape) != tuple(region.shape)
    out = torch.empty(region.shape, dtype=dtype) if whole else None
    if whole:
        run.tracker.add(region.numel * dtype.itemsize)
    n = len(region.starts) - 2
    one = ((1,) * n + cover.box.shape[n:], (0,) * n + local.starts[n:],
           (1,) * n + local.stops[n:])
    workspace = _thread_workspace(run)
    for lead in itertools.product(*(range(s) for s in region.shape[:n])):
        at = tuple(a + i for a, i in zip(region.starts[:n], lead, strict=True))
        with contextlib.ExitStack() as stack:
            parts = _lead_parts(run, stack, packed, entries, once, at)
            for _, (a, b), (c, d), x in region_chunks(scheme, parts, *one, workspace=workspace):
                if out is not None:
                    out[lead][a:b, c:d].copy_(x)
                    continue
                assert f is not None
                v = f.view
                offset = v.offset + sum(i * s for i, s in zip(lead, v.stride, strict=False)) \
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
