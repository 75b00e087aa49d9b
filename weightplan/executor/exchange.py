"""Cooperative loads: the tensors one rank read, broadcast to the others before commit.

:class:`ExchangeSink` wraps a load's sink. Writes go through; each closed destination's
tensor is kept by key. At :meth:`ExchangeSink.commit`, every item of the plan's
:class:`~weightplan.planner.pipelines.cooperative.Exchange` is broadcast from the rank
that read it into the same destination on every other rank (``torch.distributed``
broadcast of its bytes, or of the byte range one reader read when the step was cut, on
the mesh's group: gloo here, NCCL on GPUs), in the exchange's
order (the same on every rank), then the wrapped sink commits. Before the broadcasts the
ranks agree (:mod:`~weightplan.planner.pipelines.agreement`): when one failed to read its
part, the others raise :class:`~weightplan.errors.RankFailedError` instead of waiting; a
rank that leaves the group during the broadcasts is a ``RankFailedError`` too (naming the
tensor and the rank it came from).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

import torch

from weightplan.errors import ExecutionError, ParallelError, RankFailedError
from weightplan.executor.model_sink import flat_bytes
from weightplan.planner.core.geometry import View
from weightplan.planner.pipelines.agreement import Agreement
from weightplan.planner.pipelines.cooperative import Exchange
from weightplan.planner.tensors.ir.destination import Destination


def check_exchange(exchange: Exchange | None, mesh: Any) -> None:
    """Fail before any byte is read when a cooperative load has no group to share over."""
    if exchange is not None and exchange.items and mesh is None:
        raise ParallelError("TensorParallel(cooperative=True) needs a process group to "
                            "broadcast over (torchrun, or mesh=); a dry run (world_size=, "
                            "rank=) can be explained, not executed: drop cooperative=True")


class ExchangeSink:
    """A sink that broadcasts the shared destinations before its inner sink commits."""

    def __init__(self, inner: Any, exchange: Exchange, mesh: Any,
                 agreement: Agreement | None = None):
        self.inner, self.exchange, self.mesh = inner, exchange, mesh
        self.agreement = agreement
        self.handles: dict[str, torch.Tensor] = {}

    def open(self, dest: Destination) -> Any:
        return self.inner.open(dest)

    def write_bytes(self, handle: Any, dest: Destination, offset: int, data: torch.Tensor
                    ) -> None:
        self.inner.write_bytes(handle, dest, offset, data)

    def byte_view(self, handle: Any, dest: Destination, offset: int, nbytes: int
                  ) -> torch.Tensor | None:
        return self.inner.byte_view(handle, dest, offset, nbytes)

    def file_region(self, handle: Any, dest: Destination, offset: int
                    ) -> tuple[int, int, str] | None:
        return self.inner.file_region(handle, dest, offset)

    def write_view(self, handle: Any, dest: Destination, view: View, src: torch.Tensor
                   ) -> None:
        self.inner.write_view(handle, dest, view, src)

    def update_view(self, handle: Any, dest: Destination, view: View
                    ) -> torch.Tensor | None:
        return self.inner.update_view(handle, dest, view)

    def close(self, dest: Destination, handle: Any) -> None:
        self.handles[dest.key] = handle
        self.inner.close(dest, handle)

    def commit(self) -> None:
        if self.agreement is not None:
            try:
                self.agreement.agree()  # (every rank read its part: nobody waits in vain)
            except BaseException:
                self.inner.abort()
                raise
        self.broadcast()
        self.inner.commit()

    def abort(self) -> None:
        self.inner.abort()

    def broadcast(self) -> None:
        """Every shared destination, from the rank that read it to the others."""
        import torch.distributed as dist

        exchange, group = self.exchange, self.mesh.get_group()
        ranks = [dist.get_global_rank(group, r) for r in range(exchange.world_size)]
        if len(exchange.groups) > 1:  # one group per node: every rank makes every group
            made = [dist.new_group([ranks[r] for r in g]) for g in exchange.groups]
            group = made[exchange.groups.index(exchange.group)]
        for key, parts in groupby(exchange.items, key=lambda item: item.key):
            tensor = self.handles.get(key)
            if tensor is None:
                raise ExecutionError(f"{key}: a shared tensor was never opened on rank "
                                     f"{exchange.rank}; explain() again on every rank")
            flat = tensor if tensor.is_contiguous() else tensor.contiguous()  # once a tensor
            whole = flat_bytes(flat)
            for item in parts:  # (a tensor cut between readers: one part per reader)
                if item.start + item.nbytes > whole.numel():  # (every rank would wait: refuse)
                    raise ExecutionError(
                        f"{key}: bytes {item.start}..{item.start + item.nbytes} to share "
                        f"lie past its {whole.numel()} bytes on rank {exchange.rank}; "
                        "explain() again on every rank")
                _broadcast(whole[item.start:item.start + item.nbytes], ranks[exchange.owner(item)],
                           group, key)
            if flat is not tensor:
                with torch.no_grad():
                    tensor.copy_(flat)


def _broadcast(part: torch.Tensor, source: int, group: Any, key: str) -> None:
    """One broadcast of ``key``'s bytes from global rank ``source``.

    Raises:
        RankFailedError: the group broke (a rank left it: gloo's or NCCL's error, wrapped).
    """
    import torch.distributed as dist

    try:
        dist.broadcast(part, src=source, group=group)
    except RuntimeError as e:
        raise RankFailedError(f"{key}: its broadcast from rank {source} failed: a rank of this "
                              f"cooperative load left the process group during the broadcasts? "
                              f"{type(e).__name__}: {e}") from e
