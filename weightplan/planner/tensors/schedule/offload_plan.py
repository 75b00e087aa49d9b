"""Disk offload by plan: which offloaded tensors are read in place, which are written.

A tensor of a module placed on ``"disk"`` is read back at forward time by accelerate's
hooks from a safetensors file (its offload index: ``{"safetensors_file", "weight_name",
"dtype"}``; ``OffloadedWeightsLoader`` opens the file with ``safe_open`` and casts to
``dtype``, then to the parameter's dtype: the load leaves the parameter on meta in the
plan's dtype, as a resident one is installed). When the plan's step for it is a plain copy
of one whole checkpoint tensor (one read, no op, no dequantize, no shard, same shape, the
dtype kept or a float cast the loader repeats), that file is the checkpoint's own: the
tensor is *referenced in place* and its step is dropped from the schedule (nothing read,
nothing written; the checkpoint is only ever opened for reading). Anything converted
(merged experts, a fused or split projection, a dequantized FP8 weight, a permutation, a
shard) is *written* into ``offload_folder`` by the executor, one safetensors file per
tensor:

- *streamed* when every byte of it is a direct copy (merged experts, a fused projection:
  byte ranges of checkpoint tensors laid side by side): each read's bytes go straight
  from the checkpoint's pages into the file at their offset (``pwrite``), no host tensor;
- *staged* otherwise (a cast, a strided copy, ops run on tensors, a dequantize): the
  tensor is assembled in host memory and written in one piece when its step finishes.

Only staged tensors take host memory on their way to the disk (what the placement
reserves on the CPU for them, :func:`host_bytes_offloaded`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from weightplan.planner.core.geometry import Fragment, Region, View
from weightplan.planner.inputs.device import DeviceMap
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.tensors.ir.nodes import NodeKind
from weightplan.planner.tensors.lower.placement import Step


@dataclass(frozen=True, slots=True)
class OffloadedTensor:
    """One model tensor on the disk: referenced in the checkpoint, or written."""

    name: str
    aliases: tuple[str, ...]
    nbytes: int
    dtype: torch.dtype  # what the hooks hand the module (the plan's destination dtype)
    file: str | None  # the checkpoint file read in place; None: written to offload_folder
    weight_name: str  # the key inside ``file`` (the checkpoint's key when referenced)
    why_written: str = ""  # what converts it ("" when referenced)
    staged: bool = False  # written: assembled in host memory first (else streamed)

    @property
    def referenced(self) -> bool:
        return self.file is not None

    def index_entry(self) -> dict[str, str]:
        """accelerate's offload-index entry for a referenced tensor."""
        assert self.file is not None
        return {"safetensors_file": self.file, "weight_name": self.weight_name,
                "dtype": str(self.dtype).removeprefix("torch.")}


@dataclass(frozen=True)
class OffloadPlan:
    """Every offloaded tensor the checkpoint provides, in schedule order."""

    folder: str | None  # None: every tensor referenced in place (nothing to write)
    tensors: tuple[OffloadedTensor, ...]

    @property
    def referenced_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors if t.referenced)

    @property
    def written_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors if not t.referenced)

    @property
    def staged_bytes(self) -> int:
        """Of the written bytes, those assembled in host memory before they are written."""
        return sum(t.nbytes for t in self.tensors if t.staged)

    def streamed_names(self) -> frozenset[str]:
        """The written tensors streamed into their files (the others are staged)."""
        return frozenset(t.name for t in self.tensors if not t.referenced and not t.staged)

    def index(self) -> dict[str, dict[str, str]]:
        """The referenced tensors' offload-index entries, under every alias."""
        return {alias: t.index_entry() for t in self.tensors if t.referenced
                for alias in t.aliases or (t.name,)}

    def by_module(self, modules: Iterable[str]) -> dict[str, tuple[int, int, int]]:
        """Per device-map entry: (tensors referenced, tensors written, bytes written)."""
        names = sorted(modules, key=len, reverse=True)
        out: dict[str, tuple[int, int, int]] = {}
        for t in self.tensors:
            module = next((m for m in names if not m or t.name == m
                           or t.name.startswith(m + ".")), "")
            ref, wrote, nbytes = out.get(module, (0, 0, 0))
            out[module] = (ref + t.referenced, wrote + (not t.referenced),
                           nbytes + (0 if t.referenced else t.nbytes))
        return out


def plan_offload(steps: Iterable[Step], devices: DeviceMap, info: ModelInfo
                 ) -> tuple[OffloadPlan, tuple[Step, ...]]:
    """The offload plan, and the steps still to run: a referenced tensor's step is gone, a
    written one's says which destinations go to the disk (``Step.offloaded``: never
    resident) and which of them are staged in host memory until written
    (``Step.offload_staged``), so the schedule's memory model and the executor's count
    hold only those."""
    kept: list[Step] = []
    tensors: list[OffloadedTensor] = []
    for step in steps:
        dests = step.destinations
        disk = [i for i, d in enumerate(dests) if _on_disk(d, devices, info)]
        source = in_place_source(step) if len(disk) == len(dests) == 1 else None
        if source is not None:
            file, key = source
            tensors.append(_tensor(dests[0], os.path.abspath(file), key, ""))
            continue
        staged = frozenset(i for i in disk if not streams(step, i))
        kept.append(dataclasses.replace(step, offloaded=frozenset(disk), offload_staged=staged)
                    if disk else step)
        tensors.extend(_tensor(dests[i], None, dests[i].key, _why(step), i in staged)
                       for i in disk)
    return OffloadPlan(devices.offload_folder, tuple(tensors)), tuple(kept)


def host_bytes_offloaded(step: Step, target: int) -> int:
    """Host bytes destination ``target`` of ``step`` holds on its way to the disk, were it
    offloaded: none when it is referenced in place or streamed, all of it when staged."""
    dest = step.destinations[target]
    referenced = len(step.destinations) == 1 and in_place_source(step) is not None
    return 0 if referenced or streams(step, target) else dest.spec.nbytes


def streams(step: Step, target: int) -> bool:
    """Every byte of destination ``target`` is a direct copy of checkpoint bytes (no op run
    on tensors, no cast, no dequantize, no strided write): written straight into its file."""
    if step.materialize or step.quantized or not all(isinstance(r.fragment, Fragment)
                                                      for r in step.reads):
        return False
    into = [r for r in step.reads
            if isinstance(r.fragment, Fragment) and r.fragment.target == target]
    return bool(into) and all(r.direct and r.dequantize is None and r.entry.file is not None
                              and r.layout.runs is None for r in into)


def in_place_source(step: Step) -> tuple[str, str] | None:
    """``(file, key)`` when ``step`` copies one whole checkpoint tensor, unchanged but for a
    float cast, into one whole destination; else ``None``."""
    if step.materialize or step.quantized or len(step.reads) != 1 or len(step.destinations) != 1:
        return None
    read, dest = step.reads[0], step.destinations[0]
    entry = read.entry
    if read.node.kind is not NodeKind.READ or entry.file is None or not entry.contiguous \
            or dest.shard is not None or not isinstance(read.fragment, Fragment):
        return None
    shape = dest.spec.shape
    whole = read.fragment.view == View.contiguous(shape) and read.fragment.target == 0
    if not whole or entry.spec.shape != shape or read.region != Region.full(shape):
        return None
    same = entry.spec.dtype == dest.spec.dtype
    if not same and not (entry.spec.dtype.is_floating_point and dest.spec.dtype.is_floating_point):
        return None
    return entry.file, entry.key


def _on_disk(dest: Destination, devices: DeviceMap, info: ModelInfo) -> bool:
    """As the model sink decides: an offloaded parameter (buffers stay resident)."""
    t = info.get(dest.key)
    return dest.allocates and devices.offloads(dest.key) and not (t is not None and t.is_buffer)


def _tensor(dest: Destination, file: str | None, key: str, why: str,
            staged: bool = False) -> OffloadedTensor:
    return OffloadedTensor(dest.key, dest.aliases, dest.spec.nbytes, dest.spec.dtype, file,
                           key, why, staged)


def _why(step: Step) -> str:
    """What makes the step a conversion (shown beside the tensors written)."""
    if step.quantized or any(r.node.kind is not NodeKind.READ for r in step.reads):
        return "dequantize/quantize"
    if step.materialize:
        return ", ".join(dict.fromkeys(type(op).__name__ for op in step.ops))
    sources = {r.entry.key for r in step.reads}
    if len(sources) > 1:
        return f"merged from {len(sources)} checkpoint tensors"
    if any(d.shard is not None for d in step.destinations):
        return "shard"
    return "a slice or a permuted copy"


def referenced_names(plan: OffloadPlan | None) -> Mapping[str, OffloadedTensor]:
    """Offloaded tensors by name (every alias), referenced ones only."""
    if plan is None:
        return {}
    return {alias: t for t in plan.tensors if t.referenced for alias in t.aliases or (t.name,)}
