"""The plan's line about a cooperative load: storage bytes vs network bytes for this rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightplan.planner.pipelines.plan import LoadPlanData, PlanData
from weightplan.units import counted, format_bytes

if TYPE_CHECKING:  # (a plan that isn't cooperative imports no cooperative module)
    from weightplan.planner.pipelines.cooperative import Exchange


def sharing_lines(plan: PlanData) -> list[str]:
    """One line for a cooperative rank's plan (what it reads, receives and sends; its
    peak counts the tensors it receives, which land in their own memory); none otherwise."""
    exchange = plan.exchange if isinstance(plan, LoadPlanData) else None
    if exchange is None:
        return []
    # (a tensor cut between readers counts where this rank reads a part and where it
    # receives one: "tensors" are tensors touched, not parts)
    mine = {i.key for i in exchange.items if i.slot == exchange.slot}
    received = {i.key for i in exchange.items if i.slot != exchange.slot}
    cut = {i.key for i in exchange.items if i.start}  # (read in parts by several ranks)
    return [f"cooperative rank {exchange.rank} of {exchange.world_size}: storage "
            f"{format_bytes(plan.read_bytes)}, network {format_bytes(exchange.network_bytes)} "
            f"(receives {format_bytes(exchange.received_bytes)} in "
            f"{counted(len(received), 'tensor')}, broadcasts {len(mine)}{_nodes(exchange)}"
            f"{f'; {len(cut)} cut between readers' if cut else ''}); peak "
            f"{format_bytes(plan.peak_bytes)} includes the receive buffers (the tensors' own "
            "memory)"]


def _nodes(exchange: Exchange) -> str:
    """Where the broadcasts go when the ranks are grouped by node."""
    if len(exchange.groups) == 1:
        return ""
    return (f" within its node of {len(exchange.group)} ranks: each node reads its own copy")
