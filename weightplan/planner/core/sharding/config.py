"""Tensor and expert parallel loading: the public configuration.

Example:
    >>> tp = TensorParallel()                                  # doctest: +SKIP
    >>> plan = weightplan.explain(model, "ckpt/", tp=tp)       # this rank's reads only
    >>> TensorParallel(world_size=8, rank=3, output="local")   # a dry run for rank 3 of 8
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from weightplan.errors import ParallelError

EXPERTS = ("tp", "ep")
OUTPUTS = ("dtensor", "local")
STORAGES = ("shared", "node")


@dataclass(frozen=True, slots=True)
class Ranks:
    """Who this process is: ``world_size`` ranks on ``mesh`` (``None``: a dry run)."""

    world_size: int
    rank: int
    mesh: Any = field(default=None, compare=False)

    @property
    def dry_run(self) -> bool:
        return self.mesh is None


@dataclass(frozen=True)
class TensorParallel:
    """How to spread a model's parameters over the ranks of a 1-D mesh.

    Args:
        plan: ``"auto"`` (the styles transformers uses for the model: ``model.tp_plan``,
            plus ``model.ep_plan`` with ``experts="ep"``, plus ``embed_tokens:
            embedding_rowwise``; a model whose parameters are meta ``DTensor``\\ s uses
            their placements), or ``{module or parameter name: style}`` where ``*``
            stands for one name component (``"model.layers.*.mlp.up_proj": "colwise"``).
        mesh: a 1-D ``DeviceMesh``; default: the whole default process group.
        world_size, rank: without a process group, plan (and with ``output="local"``,
            execute) for one rank of a world of that size: offline pre-sharding.
        experts: ``"tp"``: the experts as ``model.tp_plan`` places them (transformers
            ≤ 5.24 splits every expert over the ranks; 5.25 keeps them whole on every
            rank, as its ``tp_plan="auto"`` does; name them in ``plan=`` to split them);
            ``"ep"`` gives each rank whole experts (``model.ep_plan``: ``grouped_gemm``).
        output: ``"dtensor"`` (parameters become ``DTensor``\\ s with transformers'
            placements) or ``"local"`` (plain local tensors).
        cooperative: each tensor every rank holds whole (norms, routers, what the plan
            doesn't shard) is read from storage by one rank, balanced by bytes, and
            broadcast to the others over the process group: the ranks together read each
            byte of the checkpoint about once.
        local_world_size: ranks per node (they are numbered node by node, as torchrun
            does); it matters to ``storage="node"`` only; default: the mesh's ranks on
            each node by torchrun's ``LOCAL_WORLD_SIZE`` under a process group, else one
            node.
        storage: with ``cooperative``: ``"shared"`` (one file system for every node: the
            cluster reads each byte once) or ``"node"`` (a copy of the checkpoint on each
            node: each node reads each byte once and broadcasts within itself).

    Raises:
        ParallelError: an argument that can't work, naming it and the fix.
    """

    plan: str | Mapping[str, str] = "auto"
    mesh: Any = field(default=None, compare=False)
    world_size: int | None = None
    rank: int | None = None
    experts: str = "tp"
    output: str = "dtensor"
    cooperative: bool = False
    local_world_size: int | None = None
    storage: str = "shared"

    def __post_init__(self) -> None:
        _check_choice("experts", self.experts, EXPERTS)
        _check_choice("output", self.output, OUTPUTS)
        _check_choice("storage", self.storage, STORAGES)
        local = self.local_world_size
        if local is not None and (isinstance(local, bool) or not isinstance(local, int)
                                  or local < 1 or (self.world_size or local) % local):
            raise ParallelError(f"TensorParallel(local_world_size={local!r}): give the ranks "
                                "per node, a whole number that divides world_size")
        _check_plan(self.plan)
        if not isinstance(self.cooperative, bool):
            raise ParallelError(f"TensorParallel(cooperative={self.cooperative!r}): use True "
                                "or False")
        if isinstance(self.plan, Mapping):
            object.__setattr__(self, "plan", MappingProxyType(dict(self.plan)))
        if (self.world_size is None) != (self.rank is None):
            raise ParallelError("pass world_size and rank together (a dry run for one rank), "
                                "or neither (use the process group)")
        if self.world_size is not None:
            _check_rank(self.world_size, self.rank)
        if self.mesh is not None:
            _check_mesh(self.mesh, self.world_size)

    def __hash__(self) -> int:
        plan = self.plan if isinstance(self.plan, str) else tuple(self.plan.items())
        return hash((plan, self.world_size, self.rank, self.experts, self.output,
                     self.cooperative, self.local_world_size, self.storage))

    def plan_entries(self) -> dict[str, str]:
        """The plan's ``{name: style}`` entries (empty for ``"auto"``)."""
        return {} if isinstance(self.plan, str) else dict(self.plan)

    def ranks_per_node(self, ranks: Ranks) -> int:
        """Ranks per node: ``local_world_size``; else, where nodes change what a rank reads
        (a cooperative load from a copy on each node, ``storage="node"``), how many of the
        mesh's ranks share this rank's node (torchrun's ``LOCAL_WORLD_SIZE`` applied to
        their global ranks: a TP sub-mesh of a larger world too); else all of them."""
        if self.local_world_size is not None:
            local = self.local_world_size
        elif self.cooperative and self.storage == "node" and not ranks.dry_run:
            local = _mesh_ranks_per_node(ranks)
        else:
            local = ranks.world_size
        if local < 1 or ranks.world_size % local:
            raise ParallelError(f"{local} ranks per node don't divide a world of "
                                f"{ranks.world_size}: pass TensorParallel(local_world_size=...)")
        return local

    def ranks(self) -> Ranks:
        """This process's place: from ``mesh``, the default group, or world_size/rank."""
        if self.mesh is not None:
            return Ranks(self.mesh.size(), self.mesh.get_local_rank(), self.mesh)
        if self.world_size is not None and self.rank is not None:
            return Ranks(self.world_size, self.rank, None)
        import torch.distributed as dist

        start_process_group()
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        mesh = init_device_mesh(_device_type(), (world,))
        return Ranks(world, dist.get_rank(), mesh)


TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets


def start_process_group() -> None:
    """The default process group: the one running, else one started from torchrun's
    environment as transformers does (``gloo`` on CPU; ``nccl`` on GPUs, each process on
    the GPU of its ``LOCAL_RANK``).

    Raises:
        ParallelError: no group runs and the environment is not torchrun's, or starting
            the group failed (the message says why).
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise ParallelError("tp= needs torch.distributed, which this build of torch lacks")
    if dist.is_initialized():
        return
    missing = [name for name in TORCHRUN if name not in os.environ]
    if missing:
        present = [name for name in TORCHRUN if name not in missing]
        under = f" (torchrun's {', '.join(missing)} not set)" if present else ""
        raise ParallelError("tp= needs a process group: run under torchrun (weightplan then "
                            "starts it from the environment), call torch.distributed."
                            "init_process_group first, pass mesh=, or world_size= and rank= "
                            f"for a dry run{under}")
    import torch

    cuda = _device_type() == "cuda"
    try:
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    except (RuntimeError, ValueError, OSError) as e:  # a bad address, a rank out of range, ...
        raise ParallelError(f"starting the process group from torchrun's environment failed "
                            f"(RANK={os.environ['RANK']}, WORLD_SIZE={os.environ['WORLD_SIZE']},"
                            f" MASTER_ADDR={os.environ['MASTER_ADDR']}): {e}") from e


def _mesh_ranks_per_node(ranks: Ranks) -> int:
    """The mesh's ranks per node, from their global ranks and ``LOCAL_WORLD_SIZE`` (unset:
    one node).

    Raises:
        ParallelError: the mesh's ranks are not node by node, the same number on each.
    """
    env = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not env.isdigit() or int(env) < 1:
        return ranks.world_size
    nodes = [g // int(env) for g in ranks.mesh.mesh.flatten().tolist()]
    counts = [nodes.count(n) for n in dict.fromkeys(nodes)]
    if sorted(nodes) != nodes or len(set(counts)) != 1:
        raise ParallelError(f"storage='node': the mesh's ranks lie on nodes {nodes} "
                            f"(LOCAL_WORLD_SIZE={env}), not node by node in equal numbers: "
                            "pass TensorParallel(local_world_size=...) or storage='shared'")
    return counts[0]


def per_node(ranks: int, nodes: int | None) -> int | None:
    """The ranks per node of ``ranks`` split into ``nodes`` (``None``: one node).

    Raises:
        ParallelError: they don't split into nodes of equal size.
    """
    if nodes is None:
        return None
    if nodes < 1 or ranks % nodes:
        raise ParallelError(f"{nodes} nodes: the {ranks} ranks don't split into {nodes} "
                            "nodes of equal size")
    return ranks // nodes


def as_tensor_parallel(tp: object) -> TensorParallel | None:
    """``None``, ``"auto"`` or a :class:`TensorParallel` → a :class:`TensorParallel`."""
    if tp is None or isinstance(tp, TensorParallel):
        return tp
    if tp == "auto":
        return TensorParallel()
    raise ParallelError(f"tp must be None, 'auto' or weightplan.TensorParallel(...), got {tp!r}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ParallelError(f"TensorParallel({name}={value!r}): use one of "
                            f"{', '.join(map(repr, choices))}")


def _check_plan(plan: object) -> None:
    if plan == "auto":
        return
    if not isinstance(plan, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in plan.items()):
        raise ParallelError(f"TensorParallel(plan={plan!r}): use 'auto' or a dict "
                            "{module-name glob: style name}")


def _check_rank(world_size: object, rank: object) -> None:
    ints = isinstance(world_size, int) and isinstance(rank, int) and not any(
        isinstance(x, bool) for x in (world_size, rank))
    if not ints or not (isinstance(world_size, int) and isinstance(rank, int)
                        and world_size >= 1 and 0 <= rank < world_size):
        raise ParallelError(f"TensorParallel(world_size={world_size!r}, rank={rank!r}): need "
                            "integers with world_size >= 1 and 0 <= rank < world_size")


def _check_mesh(mesh: Any, world_size: int | None) -> None:
    ndim = getattr(mesh, "ndim", None)
    if ndim != 1 or not hasattr(mesh, "size"):
        raise ParallelError(f"TensorParallel(mesh=...) must be a 1-D DeviceMesh, got {mesh!r}; "
                            "pass mesh['tp'] for one dimension of a larger mesh")
    if world_size is not None and mesh.size() != world_size:
        raise ParallelError(f"TensorParallel: mesh has {mesh.size()} ranks but world_size="
                            f"{world_size}; pass one or the other")


def _device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
