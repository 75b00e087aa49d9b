"""Graph nodes: frozen, hashable, one tensor value each, with ordered inputs.

The graph is ``read → op … → (cast) → assign`` per conversion group. Node kinds form a
closed enum; what a node does is in its typed ``attrs``. Equal subgraphs are equal
nodes (identity is structure); the hash is computed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from weightplan.planner.inputs.checkpoint import TensorEntry
from weightplan.planner.tensors.ops.base import ConversionOp
from weightplan.planner.tensors.spec import TensorSpec, short_dtype


class NodeKind(Enum):
    READ = "read"
    OP = "op"
    CAST = "cast"
    ASSIGN = "assign"


@dataclass(frozen=True, slots=True)
class ReadAttrs:
    entry: TensorEntry


@dataclass(frozen=True, slots=True)
class OpAttrs:
    op: ConversionOp
    stage: int  # position of the op in its converter's chain
    position: tuple[int, int]  # (stream, index) of this output


@dataclass(frozen=True, slots=True)
class CastAttrs:
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class AssignAttrs:
    target: str  # model key written
    aliases: tuple[str, ...]  # every name of the tensor (tied weights)
    allocates: bool  # True: a new tensor is allocated; False: written in place


Attrs = ReadAttrs | OpAttrs | CastAttrs | AssignAttrs


@dataclass(frozen=True, eq=True)
class Node:
    """One tensor value in the plan."""

    kind: NodeKind
    spec: TensorSpec
    inputs: tuple["Node", ...]
    attrs: Attrs
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.spec, self.inputs, self.attrs)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def label(self) -> str:
        a = self.attrs
        if isinstance(a, ReadAttrs):
            return a.entry.key
        if isinstance(a, OpAttrs):
            return repr(a.op)
        if isinstance(a, CastAttrs):
            return f"cast → {short_dtype(a.dtype)}"
        return a.target

    def __repr__(self) -> str:
        return f"<{self.kind.value} {self.label} {self.spec}>"
