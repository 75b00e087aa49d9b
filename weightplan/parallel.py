"""Tensor and expert parallel loading: the public configuration and the all-ranks view.

    tp = TensorParallel(world_size=8, rank=0)
    print(rank_table(plan_ranks(model, "ckpt/", tp)))   # every rank, from this process

See :class:`~weightplan.planner.core.sharding.config.TensorParallel`.
"""

from weightplan.planner.core.sharding.config import (
    Ranks, TensorParallel, as_tensor_parallel,
)
from weightplan.planner.pipelines.ranks import plan_ranks, rank_rows
from weightplan.viz.ranks import rank_table

__all__ = ["TensorParallel", "Ranks", "as_tensor_parallel", "plan_ranks", "rank_rows",
           "rank_table"]
