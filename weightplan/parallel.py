"""Tensor and expert parallel loading: the public configuration, preparing a model built by
hand, and the all-ranks view.

    tp = TensorParallel(world_size=8, rank=0)
    print(rank_table(plan_ranks(model, "ckpt/", tp)))   # every rank, from this process

A model built by hand runs under tensor parallelism as ``from_pretrained(tp=...)``'s does
(under torchrun, one process per rank)::

    tp = TensorParallel()                                  # the default group (started from
    with weightplan.init_empty():                          # torchrun's environment if need be)
        model = MyModel(config)
    prepare_tensor_parallel(model, tp, tp.ranks().mesh)    # transformers' TP utilities
    weightplan.load(model, "ckpt/", tp=tp)                 # each rank reads its part

See :class:`~weightplan.planner.core.sharding.config.TensorParallel`.
"""

from weightplan.bridge.distribute import prepare_tensor_parallel
from weightplan.planner.core.sharding.config import (
    Ranks, TensorParallel, as_tensor_parallel, start_process_group,
)
from weightplan.planner.pipelines.ranks import plan_ranks, rank_rows
from weightplan.viz.ranks import rank_table

__all__ = ["TensorParallel", "Ranks", "as_tensor_parallel", "plan_ranks", "rank_rows",
           "rank_table", "prepare_tensor_parallel", "start_process_group"]
