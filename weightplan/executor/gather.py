"""Saving a tensor-parallel model: gather one tensor at a time, write on one rank.

The ranks that save together (``process_group=``, :func:`save_roles`; by default the
world for a model holding ``DTensor``s) agree on one writer, the group's first rank, and
on nothing else: the ranks whose gathers reach it (the ranks of its ``DTensor``s' meshes,
its TP group) run the same write schedule, inline (threads=0), so the collectives behind
``DTensor.full_tensor()`` happen in the same order everywhere; the others (the other
data-parallel replicas) run nothing. Reads of a ``DTensor`` gather it when a step first
needs it and keep only that one gathered tensor (the next key evicts it): memory stays
bounded by the largest converter group, never a full state dict. The writer writes
through the ordinary file sink (same atomic commit; a write failing there is held until
the gathers are done: :class:`GatheringWriter`); its TP peers' writes go to
:class:`DiscardSink`. The group's ranks agree twice
(:mod:`~weightplan.planner.pipelines.agreement`): once the writer holds the directory,
once it has committed; no rank returns before the files are there, and a rank that failed
or left is a :class:`~weightplan.errors.RankFailedError` on the others.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from weightplan.planner.inputs.checkpoint import Checkpoint
from weightplan.planner.tensors.ir.destination import Destination
from weightplan.planner.core.geometry import View


def has_dtensors(checkpoint: Checkpoint) -> bool:
    """Whether the tensors saved are a tensor-parallel model's. Files (a convert) have none,
    and no ``DTensor`` exists before ``torch.distributed.tensor`` is imported: importing it
    only to ask held ~33 MiB more (a convert's RSS over its planned peak)."""
    if checkpoint.tensors is None or "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in checkpoint.tensors.values())


class GatheredTensors(Mapping[str, torch.Tensor]):
    """A ``{key: tensor}`` view that gathers ``DTensor`` values on access, one at a time."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self._tensors = tensors
        self._last: tuple[str, torch.Tensor] | None = None

    def __getitem__(self, key: str) -> torch.Tensor:
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        tensor = self._tensors[key]
        if hasattr(tensor, "full_tensor"):
            self._last = None  # free the previous one before gathering the next
            tensor = tensor.full_tensor().detach()
            self._last = (key, tensor)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def gathering(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` whose in-memory DTensors are gathered when read."""
    assert checkpoint.tensors is not None
    return dataclasses.replace(checkpoint, tensors=GatheredTensors(checkpoint.tensors))


class DiscardSink:
    """The sink of the ranks that don't write: every write is dropped."""

    def open(self, dest: Destination) -> None:
        return None

    def write_bytes(self, handle: Any, dest: Destination, offset: int, data: torch.Tensor) -> None:
        return None

    def byte_view(self, handle: Any, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        return None

    def file_region(self, handle: Any, dest: Destination, offset: int) -> tuple[int, int, str] | None:
        return None

    def write_view(self, handle: Any, dest: Destination, view: View, src: torch.Tensor) -> None:
        return None

    def update_view(self, handle: Any, dest: Destination, view: View) -> torch.Tensor | None:
        return None

    def close(self, dest: Destination, handle: Any) -> None:
        return None

    def commit(self) -> None:
        return None

    def abort(self) -> None:
        return None


class GatheringWriter:
    """The writer's file sink while its TP peers gather with it. A write that fails (a
    full disk) is held: the files are removed at once and the later writes dropped (as
    :class:`DiscardSink` drops them), so the writer still takes part in every gather its
    peers wait in, then :meth:`commit` raises it (and the ranks agree on it). Raising at
    once would leave a peer in a gather while the writer waits in the agreement, both until
    the group's timeout. Inline runs only (``threads=0``, as every gathering save)."""

    def __init__(self, sink: Any):
        self._sink: Any = sink
        self.failure: Exception | None = None

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self._sink, method)(*args)
        except Exception as e:
            if self.failure is not None:
                raise
            self.failure = e
            self._sink.abort()
            self._sink = DiscardSink()
            return None

    def open(self, dest: Destination) -> Any:
        return self._call("open", dest)

    def write_bytes(self, handle: Any, dest: Destination, offset: int, data: torch.Tensor) -> None:
        self._call("write_bytes", handle, dest, offset, data)

    def byte_view(self, handle: Any, dest: Destination, offset: int,
                  nbytes: int) -> torch.Tensor | None:
        return self._call("byte_view", handle, dest, offset, nbytes)

    def file_region(self, handle: Any, dest: Destination, offset: int) -> tuple[int, int, str] | None:
        return self._call("file_region", handle, dest, offset)

    def write_view(self, handle: Any, dest: Destination, view: View, src: torch.Tensor) -> None:
        self._call("write_view", handle, dest, view, src)

    def update_view(self, handle: Any, dest: Destination, view: View) -> torch.Tensor | None:
        return self._call("update_view", handle, dest, view)

    def close(self, dest: Destination, handle: Any) -> None:
        self._call("close", dest, handle)

    def commit(self) -> None:
        if self.failure is not None:
            raise self.failure
        self._sink.commit()

    def abort(self) -> None:
        self._sink.abort()


@dataclasses.dataclass(frozen=True)
class SaveRoles:
    """This rank's part in a save: ``group`` the ranks agree on (``None``: alone),
    whether it ``writes`` the files, whether it ``runs`` the schedule (its gathers reach
    the writer), and ``outside``: the ranks those gathers need that ``group`` lacks."""

    group: Any
    writes: bool
    runs: bool
    outside: tuple[int, ...] = ()

    def check(self) -> None:
        """:class:`SaveError` when the gathers would wait on ranks that don't save."""
        if self.outside:
            from weightplan.errors import SaveError

            raise SaveError(f"the model's DTensors are sharded over ranks {list(self.outside)}"
                            " too, which are not in process_group=: pass a group holding the "
                            "model's whole TP group (e.g. mesh['tp'].get_group())")


def save_roles(checkpoint: Checkpoint, process_group: Any) -> SaveRoles:
    """The roles of a save on ``process_group`` (a ``ProcessGroup`` or a 1-D
    ``DeviceMesh``); ``None``: the world for a model holding ``DTensor``s (every rank
    saves, as before), no group for any other (the caller writes alone)."""
    import torch.distributed as dist

    sharded = has_dtensors(checkpoint)
    group = save_group(process_group, sharded)
    if group is None:
        return SaveRoles(None, True, True)
    me = dist.get_rank()
    writer = dist.get_global_rank(group, 0)
    needed = _mesh_ranks(checkpoint) if sharded else {me}
    if writer not in needed:
        return SaveRoles(group, False, False)
    members = set(dist.get_process_group_ranks(group))
    return SaveRoles(group, me == writer, True, tuple(sorted(needed - members)))


def save_group(process_group: Any, sharded: bool) -> Any:
    """The group whose ranks save together (``None``: this rank saves alone); ``sharded``:
    the model holds ``DTensor``s (by default the world saves it)."""
    import torch.distributed as dist

    from weightplan.errors import SaveError

    if not (dist.is_available() and dist.is_initialized()):
        if process_group is not None:
            raise SaveError("process_group= names a process group, but torch.distributed "
                            "is not initialized")
        return None
    group = _as_group(process_group if process_group is not None
                      else dist.group.WORLD if sharded else None)
    if group is not None and dist.get_rank(group) < 0:
        raise SaveError(f"rank {dist.get_rank()} is not in process_group=: only its ranks "
                        "call save")
    return group


def model_has_dtensors(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters or buffers hold ``DTensor``s (see :func:`has_dtensors`)."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in (*model.parameters(), *model.buffers()))


def _as_group(group: Any) -> Any:
    if hasattr(group, "get_group"):  # a DeviceMesh (a 1-D one: its group)
        return group.get_group()
    return group


def _mesh_ranks(checkpoint: Checkpoint) -> set[int]:
    """The global ranks this rank's ``DTensor``s are gathered over (their meshes')."""
    from torch.distributed.tensor import DTensor

    assert checkpoint.tensors is not None
    meshes = {id(t.device_mesh): t.device_mesh for t in checkpoint.tensors.values()
              if isinstance(t, DTensor)}
    return {r for m in meshes.values() for r in m.mesh.flatten().tolist()}
