"""Every rank of a tensor-parallel load as text: one row per rank (bytes read from storage,
bytes over the network, held, replicated, peak), the totals, what every rank holds whole
and why, what is read whole, and the problems folded like a plan's (rank 0's: the ranks
resolve one plan)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from weightplan.planner.pipelines.plan import LoadPlanData
from weightplan.planner.pipelines.ranks import network_bytes, whole_reads
from weightplan.units import format_bytes
from weightplan.viz.folding import fold_keys
from weightplan.viz.text import MAX_LIST, MIN_WIDTH, problem_lines, quantized_text, wrapped

WIDTH = 100  # the key lists wrap here


def rank_table(plans: tuple[LoadPlanData, ...], *, wording: Callable[[str], str] = str,
               width: int | None = None) -> str:
    """A text table: one row per rank (storage, network, held, replicated, peak, storage /
    (total/N)), the totals over the ranks, then the replicated tensors by reason, the
    whole reads and the problems; ``wording`` rewrites the advice of the messages (the
    command line gives its flags); ``width``: every line wrapped at it (the key lists wrap
    at 100 without it)."""
    if not plans or plans[0].sharding is None:
        return "no tensor-parallel ranks"
    first = plans[0].sharding
    world, total = first.world_size, plans[0].checkpoint.nbytes
    head = (f"tensor parallel over {world} ranks ({first.plan.source}); checkpoint "
            f"{format_bytes(total)}, 1/{world} = {format_bytes(total / world)}")
    quantized = quantized_text(plans[0])
    if quantized:
        head += f"\nquantized checkpoint: {quantized} (rank 0)"
    rows = [f"{'rank':>4}  {'storage':>10}  {'network':>10}  {'held':>10}  "
            f"{'replicated':>10}  {'peak':>10}  {'storage/(total/N)':>17}"]
    for p in plans:
        assert p.sharding is not None
        ratio = p.read_bytes / (total / world) if total else 0.0
        rows.append(f"{p.sharding.rank:>4}  {format_bytes(p.read_bytes):>10}  "
                    f"{format_bytes(network_bytes(p)):>10}  {format_bytes(p.held_bytes):>10}  "
                    f"{format_bytes(p.replicated_bytes):>10}  {format_bytes(p.peak_bytes):>10}  "
                    f"{ratio:>17.3f}")
    rows.append(totals_line(plans, total))
    notes = replicated_lines(plans[0])
    whole = whole_reads(plans[0])
    if whole:
        notes.append(f"read whole (an op can't take a slice): {_listed(fold_keys(whole))}")
    problems = [wording(line) for line in problem_lines(plans[0])] if plans[0].problems else []
    lines = "\n".join([head, *rows, *notes, *problems]).splitlines()
    if width is not None:
        lines = [part for line in lines for part in wrapped(line, max(width, MIN_WIDTH))]
    return "\n".join(lines)


def totals_line(plans: tuple[LoadPlanData, ...], total: int) -> str:
    """All the ranks planned: storage bytes against the checkpoint's, and the network."""
    storage = sum(p.read_bytes for p in plans)
    exchange = plans[0].exchange
    how = ("replicated tensors read by every rank" if exchange is None else
           "each replicated tensor read by one rank and broadcast" if len(exchange.groups) == 1
           else "nodes of one rank: each reads the replicated tensors itself, nothing to "
                "broadcast" if len(exchange.group) == 1
           else f"each replicated tensor read once per node of {len(exchange.group)} ranks "
                "and broadcast within it")
    return (f"{len(plans)} ranks: storage {format_bytes(storage)} = "
            f"{storage / total if total else 0.0:.3f}× the checkpoint, network "
            f"{format_bytes(sum(map(network_bytes, plans)))} ({how}); peak includes the "
            "receive buffers (the replicated tensors' own memory)")


def replicated_lines(plan: LoadPlanData) -> list[str]:
    """What every rank holds whole, grouped by why: no plan entry names the tensor, or the
    entry's style keeps it whole (``replicated_with_grad_allreduce``, a row-wise bias)."""
    sharding = plan.sharding
    if sharding is None or not plan.replicated_bytes:
        return []
    reasons: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for step in plan.schedule.steps:
        for d in step.destinations:
            if not d.written or (d.shard is not None and d.shard.placement.is_sharded):
                continue
            entry = sharding.plan.params.get(d.key)
            why = (f"no entry of {sharding.plan.source} names them" if entry is None or
                   entry.style is None else f"{entry.rule}: {entry.style} keeps them whole")
            reasons.setdefault(why, []).append(d.key)
            sizes[why] = sizes.get(why, 0) + d.spec.nbytes
    lines = [f"replicated (whole on every rank, {format_bytes(plan.replicated_bytes)}):"]
    for why, keys in reasons.items():
        lines.append(f"  {why} ({len(keys)}, {format_bytes(sizes[why])}):")
        lines += textwrap.wrap(_listed(fold_keys(keys)), WIDTH, initial_indent="    ",
                               subsequent_indent="    ", break_on_hyphens=False)
    return lines


def _listed(folded: list[str]) -> str:
    more = f", … {len(folded) - MAX_LIST} more" if len(folded) > MAX_LIST else ""
    return ", ".join(folded[:MAX_LIST]) + more
