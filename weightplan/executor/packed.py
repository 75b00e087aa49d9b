"""The packed dequantize read: a stored weight's parts, decoded into the destination.

A packed dequantize node's read task maps its whole stored weight and its (small) parts,
and writes the region it lands in chunk by chunk through the sink (an fp32 workspace of
at most ``CHUNK_BYTES``); an input of materialized ops, or a reshaped landing, gets a
fresh dequantized tensor of the region (counted as the task's temporary).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from weightplan.planner.core.geometry import View
from weightplan.planner.core.quant.formats import Scheme, region_chunks
from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.lower.placement import ReadTask, Step


def packed_read(run: Any, program: Step, step: Any, task: ReadTask) -> None:
    """Dequantize the task's region of its packed weight into its fragment (or hold it)."""
    attrs = task.dequantize
    assert attrs is not None and isinstance(attrs.scheme, Scheme)
    entries = [n.attrs.entry for n in task.node.inputs]  # type: ignore[union-attr]
    run.tracker.add(task.layout.window_bytes)
    try:
        with contextlib.ExitStack() as stack:
            parts = [_part(run, stack, e) for e in entries]
            _decode_into(run, program, step, task, attrs.scheme, parts)
    finally:
        run.tracker.sub(task.layout.window_bytes)


def _part(run: Any, stack: contextlib.ExitStack, entry: TensorEntry) -> torch.Tensor:
    """A stored part as a tensor of its header's shape (a mapped window for a file)."""
    if entry.file is None:
        assert run.checkpoint.tensors is not None
        return run.checkpoint.tensors[entry.key]
    raw = stack.enter_context(run.reader.window(entry.file, entry.offset, entry.nbytes))
    return raw.view(entry.spec.dtype).reshape(entry.spec.shape)


def _decode_into(run: Any, program: Step, step: Any, task: ReadTask, scheme: Scheme,
                 parts: list[torch.Tensor]) -> None:
    region, f = task.region, task.fragment
    shape = tuple(task.node.spec.shape)
    dtype = task.node.spec.dtype
    whole = f is None or tuple(f.view.shape) != tuple(region.shape)
    out = torch.empty(region.shape, dtype=dtype) if whole else None
    if whole:
        run.tracker.add(region.numel * dtype.itemsize)
    chunks = region_chunks(scheme, parts, shape, region.starts, region.stops)
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
