"""The ranks of a save agree on their plans before the writer takes the directory, and on
how the save ended after it committed.

1. Planned (:func:`agree_on_plan`, the first collective of a save on a group): each rank
   tells the others whether its plan was made (a rank whose ``explain_save`` failed tells
   its error instead: :func:`tell_plan_failure`) and a digest of what it plans to write and
   gather (:func:`plan_summary`). A failed rank: a :class:`RankFailedError` naming it on
   the others, at once (not at the group's timeout, from inside a gather). Digests that
   differ (a rank's model holds a tensor the others lack, or of another shape, dtype or
   sharding, or its gathers would come in another order: they would pair with the wrong
   tensors, or wait forever): one more collective of the summaries, then a
   :class:`SaveError` on every rank naming each rank that differs from the writer and the
   first key it differs on. Nothing is written in either case.
2. Done (:func:`agree_done`): each rank tells whether it failed and whether it committed
   (the writer). Once the writer has committed, a failure anywhere says so: the
   checkpoint in the directory is complete (the writer committed only after every gather
   its TP peers took part in), and what failed is named.
"""

from __future__ import annotations

import hashlib
import json
from itertools import zip_longest
from dataclasses import dataclass
from typing import Any

from weightplan.errors import ExecutionError, RankFailedError, SaveError
from weightplan.planner.pipelines.agreement import Agreement
from weightplan.planner.pipelines.write_plan import WritePlanData

PLAN_STAGE = "to plan the save"
_SHOWN = 4  # ranks named in a refusal; the others are counted


@dataclass(frozen=True)
class PlanSummary:
    """What a rank's save plan writes (key → dtype and shape), what it reads from the
    model (key → dtype, shape and, for a ``DTensor``, its sharding) and in which order."""

    writes: dict[str, str]
    reads: dict[str, str]
    order: tuple[str, ...]

    def digest(self) -> str:
        text = json.dumps([sorted(self.writes.items()), sorted(self.reads.items()),
                           self.order])
        return hashlib.sha256(text.encode()).hexdigest()


def plan_summary(plan: WritePlanData) -> PlanSummary:
    """``plan``'s :class:`PlanSummary` (headers and read tasks only: no tensor data)."""
    writes: dict[str, str] = {}
    for shard in plan.layout.files:
        size = int.from_bytes(shard.header[:8], "little")
        header = json.loads(shard.header[8:8 + size])
        writes.update((k, f"{v['dtype']} {v['shape']}") for k, v in header.items()
                      if k != "__metadata__")
    tensors = plan.checkpoint.tensors or {}
    reads: dict[str, str] = {}
    order: list[str] = []
    for step in plan.schedule.steps:
        for task in step.reads:
            key, spec = task.entry.key, task.entry.spec
            if not order or order[-1] != key:
                order.append(key)
            reads[key] = f"{str(spec.dtype).removeprefix('torch.')} {list(spec.shape)}" \
                         f"{_sharding(tensors.get(key)) if key in tensors else ''}"
    return PlanSummary(writes, reads, tuple(order))


def _sharding(tensor: Any) -> str:
    if not hasattr(tensor, "placements"):  # a plain tensor (no DTensor)
        return ""
    placements = ", ".join(map(str, tensor.placements))
    return f" DTensor({placements}) on a {'×'.join(map(str, tensor.device_mesh.shape))} mesh"


def planning(group: Any) -> Agreement:
    """The agreement of the ranks of ``group`` on their save plans."""
    return Agreement(group, PLAN_STAGE, work="save", instead="waiting for its writer",
                     gone="a rank left the process group, or never called save?")


def tell_plan_failure(group: Any, error: BaseException) -> None:
    """This rank's plan failed (``error``): tell the others, which wait in
    :func:`agree_on_plan` (the failure of the telling itself is dropped: ``error`` goes on)."""
    try:
        planning(group).gather(error)
    except RankFailedError:
        pass


def agree_on_plan(group: Any, plan: WritePlanData, writer: int) -> None:
    """Every rank of ``group`` planned the same save (see the module's docstring)."""
    if group is None:
        return
    point = planning(group)
    with point:  # (a summary that fails is told too)
        summary = plan_summary(plan)
        digests = point.agree(value=summary.digest())
    if len(set(digests.values())) > 1:
        raise SaveError(f"{plan.directory}: " + _disagreement(_summaries(group, summary),
                                                              writer))


def _summaries(group: Any, mine: PlanSummary) -> dict[int, PlanSummary]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(gathered, mine, group=group)
    except Exception as e:
        raise RankFailedError(f"the ranks of this save planned different checkpoints, and "
                              f"could not compare them: {type(e).__name__}: {e}") from e
    return {dist.get_global_rank(group, r): s for r, s in enumerate(gathered)}


def _disagreement(summaries: dict[int, PlanSummary], writer: int) -> str:
    """What each rank's plan holds that the writer's doesn't (its first key)."""
    ours = summaries[writer]
    found = [f"rank {r}: {_first_difference(s, ours, writer)}"
             for r, s in sorted(summaries.items()) if s.digest() != ours.digest()]
    more = f"; and {len(found) - _SHOWN} more ranks" if len(found) > _SHOWN else ""
    return ("the ranks of this save planned different checkpoints, so none writes "
            f"(nothing was written): {'; '.join(found[:_SHOWN])}{more}. Every rank of "
            "process_group= saves the same model (the same keys, shapes, dtypes and "
            "sharding)")


def _first_difference(theirs: PlanSummary, ours: PlanSummary, writer: int) -> str:
    for what, mine, other in (("writes", theirs.writes, ours.writes),
                              ("reads from the model", theirs.reads, ours.reads)):
        for key in sorted(mine.keys() | other.keys()):
            if key not in other:
                return f"{what} {key} ({mine[key]}), which rank {writer} (the writer) doesn't"
            if key not in mine:
                return f"lacks {key} ({other[key]}), which rank {writer} (the writer) {what}"
            if mine[key] != other[key]:
                return (f"{what} {key} as {mine[key]}, rank {writer} (the writer) as "
                        f"{other[key]}")
    at = next(i for i, (a, b) in enumerate(zip_longest(theirs.order, ours.order)) if a != b)
    here, there = (o[at] if at < len(o) else "nothing" for o in (theirs.order, ours.order))
    return (f"gathers {here} where rank {writer} (the writer) gathers {there} (tensor "
            f"#{at + 1}): the order differs")


def agree_done(point: Agreement, directory: str, error: Exception | None,
               committed: bool) -> None:
    """The end of a save on ``point``'s group: ``error`` this rank's failure, ``committed``
    whether this rank committed the checkpoint. Raises when any rank failed, saying the
    checkpoint is complete where the writer committed it; returns otherwise (the caller
    raises its own ``error`` where nothing was committed)."""
    try:  # (the writer tells its directory: per-node paths differ from this rank's)
        failures, values = point.gather(error, str(directory) if committed else None)
    except RankFailedError as e:
        if not committed:
            raise
        raise RankFailedError(f"{directory}: the checkpoint was committed complete by this "
                              f"rank (its writer); afterwards {e}", committed=True) from e
    writers = sorted((r, where) for r, where in values.items() if where)
    if not writers:
        if error is None:
            point.stop(failures)
        return
    (writer, where), mine = writers[0], str(directory)
    apart = "" if where == mine else f" (its directory: this rank's {mine} was not written)"
    done = f"{where}: the checkpoint was committed complete by rank {writer} (its writer){apart}, but"
    if error is not None:
        raise ExecutionError(f"{done} this rank failed: {type(error).__name__}: "
                             f"{error}") from error
    if failures:
        named = "; ".join(f"rank {r} failed: {e}" for r, e in sorted(failures.items()))
        raise RankFailedError(f"{done} {named}", failures=failures, committed=True)
