"""Execute one rank's sharded programs: local tensors, or DTensors on the mesh.

The rank's programs go through the same schedule and executor as an unsharded load (reads
land straight in the local tensors); only the sink differs: :class:`ShardSink` keeps each
destination's local tensor and, at commit, installs it into the model as a plain tensor
(``output="local"``) or as ``DTensor.from_local(local, mesh, [placement], shape=global)``
(``output="dtensor"``), so every rank's parameter reports the global shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from weightplan.errors import ParallelError
from weightplan.executor.run import run_plan
from weightplan.executor.sinks import flat_bytes, module_and_attr, strided
from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.budget import schedule_within
from weightplan.planner.tensors.geometry import View
from weightplan.planner.tensors.placement import Destination
from weightplan.planner.tensors.schedule import Schedule, order_programs
from weightplan.planner.tensors.sharding.pushdown import DestShard, ShardedProgram


@dataclass(frozen=True)
class _RankRun:
    """What the executor needs from a plan: the schedule, the checkpoint, the bytes."""

    schedule: Schedule
    checkpoint: Checkpoint
    read_bytes: int


@dataclass(frozen=True)
class _Options:
    threads: int
    budget: int | None = None
    dtype: torch.dtype | None = None


@dataclass
class ShardLoad:
    """What one rank loaded: local tensors by model key, bytes read, seconds."""

    tensors: dict[str, torch.Tensor]
    bytes_read: int
    local_bytes: int
    seconds: float
    peak_bytes: int = 0
    placements: dict[str, DestShard] = field(default_factory=dict)


class ShardSink:
    """Collects local tensors; installs them (local or DTensor) only at commit."""

    def __init__(self, shards: dict[str, DestShard], model: nn.Module | None, output: str,
                 mesh: object | None):
        self.shards, self.model, self.output, self.mesh = shards, model, output, mesh
        self.results: dict[str, tuple[Destination, torch.Tensor]] = {}

    def open(self, dest: Destination) -> torch.Tensor:
        return torch.empty(dest.spec.shape, dtype=dest.spec.dtype)

    def write_bytes(self, handle, dest, offset: int, data: torch.Tensor) -> None:
        flat_bytes(handle)[offset:offset + data.numel()].copy_(data)

    def write_view(self, handle, dest, view: View, src: torch.Tensor) -> None:
        with torch.no_grad():
            strided(handle, view).copy_(src.reshape(view.shape))

    def close(self, dest: Destination, handle: torch.Tensor) -> None:
        self.results[dest.key] = (dest, handle)

    def abort(self) -> None:
        self.results.clear()

    def commit(self) -> None:
        if self.model is None:
            return
        for dest, tensor in self.results.values():
            value = self.wrap(dest, tensor)
            for alias in dest.aliases:
                module, attr = module_and_attr(self.model, alias)
                if attr in module._buffers:
                    module._buffers[attr] = value
                else:
                    module._parameters[attr] = nn.Parameter(
                        value, requires_grad=value.is_floating_point())

    def wrap(self, dest: Destination, local: torch.Tensor) -> torch.Tensor:
        shard = self.shards[dest.key]
        if self.output == "local" or not shard.placement.is_dtensor:
            return local
        from torch.distributed.tensor import DTensor

        glob = shard.global_spec.shape
        return DTensor.from_local(local, self.mesh, [shard.placement.to_torch()],
                                  run_check=False, shape=torch.Size(glob),
                                  stride=View.contiguous(glob).stride)


def execute_rank(programs: tuple[ShardedProgram, ...], checkpoint: Checkpoint, *,
                 model: nn.Module | None = None, output: str = "local", mesh: object = None,
                 threads: int = 4, progress: bool | None = False) -> ShardLoad:
    """Run one rank's programs; with ``model``, install the results into it."""
    if output == "dtensor" and mesh is None and model is not None:
        raise ParallelError("output='dtensor' needs a DeviceMesh (a process group); a dry run "
                            "(world_size=, rank=) can only produce output='local'")
    shards = {d.key: s for p in programs for d, s in zip(p.program.destinations, p.shards)}
    steps = tuple(p.program for p in programs)
    files = [f.path for f in checkpoint.files]
    schedule = schedule_within(order_programs(steps, files), _Options(threads))
    read = sum(p.read_bytes for p in programs)
    sink = ShardSink(shards, model, output, mesh)
    stats = run_plan(_RankRun(schedule, checkpoint, read), sink, progress=progress)
    tensors = {key: t for key, (_, t) in sink.results.items()}
    local = sum(t.numel() * t.element_size() for t in tensors.values())
    return ShardLoad(tensors, read, local, stats.seconds, stats.peak_bytes, shards)
