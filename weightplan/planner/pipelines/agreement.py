"""The ranks of a cooperative load agree before they wait on each other.

In a cooperative load (:mod:`~weightplan.planner.pipelines.cooperative`) every rank waits
in the broadcasts for tensors other ranks read. A rank that failed before them (its
checkpoint copy missing or corrupt, a read that failed) would leave the others waiting
until the process group's timeout. So each rank tells the others how it fared at two
points: when it has planned (``explain``), and when its own reads are done (before the
broadcasts) or have failed. One collective each (``all_gather_object`` of the error's
text or ``None``, and a value the ranks compare, on the load's group): when any rank
failed, every other rank raises :class:`~weightplan.errors.RankFailedError` naming it and
its error, and the failing rank raises its own error. Dry runs and plain loads agree on
nothing (no group, no waiting). A sharded save agrees the same way on its plan and its
writer (:mod:`~weightplan.executor.save_agreement`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from weightplan.errors import RankFailedError


class Agreement:
    """One point where the ranks of ``group`` (``None``: nothing to agree) tell each other
    how they fared; a context manager whose failure is told to the others, and
    :meth:`agree` for success. Each rank agrees once per point, whichever way. ``work``
    and ``instead`` name what the ranks do together and what a rank stops waiting for (a
    tensor-parallel save agrees the same way: :mod:`~weightplan.executor.gather`)."""

    def __init__(self, group: Any | Callable[[], Any], stage: str, *,
                 work: str = "cooperative load", instead: str = "waiting for its broadcasts",
                 gone: str = "a rank left the process group?"):
        self._group, self.stage, self.done = group, stage, False
        self.work, self.instead, self.gone = work, instead, gone

    def agree(self, error: BaseException | None = None, value: Any = None) -> dict[int, Any]:
        """Tell the others (``error``: this rank's failure; ``value``: anything small the
        ranks compare) and hear them; raise :class:`RankFailedError` when another rank
        failed and this one didn't. Returns every rank's ``value`` (global rank → value)."""
        failures, values = self.gather(error, value)
        if error is None:
            self.stop(failures)
        return values

    def stop(self, failures: dict[int, str]) -> None:
        """:class:`RankFailedError` naming ``failures`` (global rank → error), if any."""
        if failures:
            named = "; ".join(f"rank {r}: {e}" for r, e in sorted(failures.items()))
            raise RankFailedError(f"{_ranks(failures)} of this {self.work} failed "
                                  f"{self.stage}, so this rank stops instead of "
                                  f"{self.instead}: {named}", failures=failures)

    def gather(self, error: BaseException | None = None,
               value: Any = None) -> tuple[dict[int, str], dict[int, Any]]:
        """:meth:`agree` without raising for the others' failures: (global rank → error
        text, for the ranks that failed; global rank → value, for every rank)."""
        group = self._group() if callable(self._group) else self._group
        if self.done or group is None:
            return {}, {}
        self.done = True
        outcomes = _gathered(group, (None if error is None else _text(error), value), self)
        failures = {r: e for r, (e, _) in outcomes.items() if e is not None}
        return failures, {r: v for r, (_, v) in outcomes.items()}

    def __enter__(self) -> Agreement:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if error is not None and isinstance(error, Exception):
            self.agree(error)  # (then this rank's own error goes on)


def planning_group(tp: object, cooperative: bool) -> Callable[[], Any]:
    """The group a cooperative load on live ranks plans on, looked up when asked (the
    planning may start the default group); ``None`` for dry runs and plain loads."""

    def group() -> Any:
        from weightplan.planner.core.sharding.config import as_tensor_parallel

        parallel = as_tensor_parallel(tp)
        if parallel is None or not (cooperative or parallel.cooperative):
            return None
        if parallel.mesh is not None:
            return parallel.mesh.get_group()
        if parallel.world_size is not None and parallel.rank is not None:
            return None  # a dry run of one rank
        import torch.distributed as dist

        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    return group


def _gathered(group: Any, mine: tuple[str | None, Any],
              point: Agreement) -> dict[int, tuple[str | None, Any]]:
    """Every rank's outcome: global rank → (error text or ``None``, value)."""
    import torch.distributed as dist

    outcomes: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(outcomes, mine, group=group)
        ranks = [dist.get_global_rank(group, r) for r in range(len(outcomes))]
    except Exception as e:  # (a rank gone: gloo's or NCCL's error, wrapped)
        raise RankFailedError(f"the ranks of this {point.work} could not agree "
                              f"{point.stage} ({point.gone}): "
                              f"{type(e).__name__}: {e}") from e
    return dict(zip(ranks, outcomes, strict=True))


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _ranks(failures: dict[int, str]) -> str:
    ranks = sorted(failures)
    return f"rank {ranks[0]}" if len(ranks) == 1 else \
        "ranks " + ", ".join(map(str, ranks))
