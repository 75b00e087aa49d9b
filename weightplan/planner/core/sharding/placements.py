"""Where one parameter lives across the ranks of a 1-D mesh: plain, replicated or sharded.

:class:`Placement` is weightplan's own frozen description of a DTensor placement, so the
planner can reason about shards in a process with no process group (a dry run for rank 5
of 8 on a laptop). It converts to and from ``torch.distributed.tensor`` placements:

- ``PLAIN``: not a DTensor at all; every rank holds the whole tensor (norms, routers,
  DeepSeek-V3's MLA projections, every parameter the plan does not name);
- ``REPLICATE``: a ``DTensor`` with ``Replicate()`` (a rowwise layer's bias);
- ``SHARD``: ``Shard(dim)``, split like ``torch.chunk`` (ceil-sized chunks, the last ranks
  possibly smaller or empty);
- ``STRIDED``: ``_StridedShard(dim, split_factor)``: the dim is first cut into
  ``split_factor`` blocks (the halves of a packed gate|up), each block is chunked over the
  ranks, and a rank holds its chunk of every block, concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from weightplan.errors import PlanError


class PlacementKind(Enum):
    PLAIN = "plain"
    REPLICATE = "replicate"
    SHARD = "shard"
    STRIDED = "strided"


@dataclass(frozen=True, slots=True)
class Placement:
    """One parameter's placement on a 1-D mesh (see the module docstring)."""

    kind: PlacementKind
    dim: int | None = None
    split_factor: int = 1

    @classmethod
    def plain(cls) -> "Placement":
        return cls(PlacementKind.PLAIN)

    @classmethod
    def replicate(cls) -> "Placement":
        return cls(PlacementKind.REPLICATE)

    @classmethod
    def shard(cls, dim: int) -> "Placement":
        return cls(PlacementKind.SHARD, dim)

    @classmethod
    def strided(cls, dim: int, split_factor: int) -> "Placement":
        return cls(PlacementKind.STRIDED, dim, split_factor)

    @property
    def axis(self) -> int:
        """The sharded dim (only for ``SHARD`` / ``STRIDED``)."""
        if self.dim is None:
            raise PlanError(f"placement {self} shards no dim")
        return self.dim

    @property
    def is_sharded(self) -> bool:
        return self.kind in (PlacementKind.SHARD, PlacementKind.STRIDED)

    @property
    def is_dtensor(self) -> bool:
        return self.kind is not PlacementKind.PLAIN

    def normalized(self, ndim: int) -> "Placement":
        """Negative dims counted from the end, as ``distribute_tensor`` does."""
        if self.dim is None or self.dim >= 0:
            return self
        if self.dim + ndim < 0:
            raise PlanError(f"placement {self} does not fit a {ndim}-d tensor")
        return Placement(self.kind, self.dim + ndim, self.split_factor)

    def to_torch(self) -> Any:
        """The ``torch.distributed.tensor`` placement (``None`` for a plain tensor)."""
        from torch.distributed.tensor import Replicate, Shard

        if self.kind is PlacementKind.PLAIN:
            return None
        if self.kind is PlacementKind.REPLICATE:
            return Replicate()
        if self.kind is PlacementKind.SHARD:
            return Shard(self.axis)
        from torch.distributed.tensor.placement_types import _StridedShard

        return _StridedShard(self.axis, split_factor=self.split_factor)

    @classmethod
    def from_torch(cls, placement: Any) -> "Placement":
        """From a torch placement; ``Partial`` (a pending reduction) has no meaning here."""
        name = type(placement).__name__
        if name == "Replicate":
            return cls.replicate()
        if name == "_StridedShard":
            return cls.strided(placement.dim, placement.split_factor)
        if name == "Shard":
            return cls.shard(placement.dim)
        raise PlanError(f"placement {placement!r} can't describe a loaded parameter: use "
                        "Shard, _StridedShard or Replicate")

    def __str__(self) -> str:
        if self.kind is PlacementKind.PLAIN:
            return "plain"
        if self.kind is PlacementKind.REPLICATE:
            return "Replicate()"
        if self.kind is PlacementKind.SHARD:
            return f"Shard(dim={self.dim})"
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"


@dataclass(frozen=True, slots=True)
class DestShard:
    """A destination that is one rank's part of a parameter: how it sits in the whole."""

    placement: Placement
    global_shape: tuple[int, ...]
    rank: int
    world_size: int
