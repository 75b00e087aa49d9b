"""Tensor and expert parallel loading: the public configuration (see
:class:`~weightplan.planner.tensors.sharding.config.TensorParallel`)."""

from weightplan.planner.tensors.sharding.config import (
    TensorParallel, Ranks, as_tensor_parallel,
)

__all__ = ["TensorParallel", "Ranks", "as_tensor_parallel"]
