"""Ops the transformers bridge needs beyond weightplan's built-in ones."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from weightplan.errors import NotInvertibleError, OpError
from weightplan.planner.geometry import Fragment
from weightplan.planner.ops.base import (
    OpContext, Streams, TensorwiseOp, normalize_dim, single_input,
)
from weightplan.planner.spec import TensorSpec


@dataclass(frozen=True, repr=False)
class TransposeToFit(TensorwiseOp):
    """transformers' ``Transpose(check_dims=True)``: swap two dims unless the checkpoint
    tensor already has the model tensor's shape, so both layouts load.

    Decided at plan time from the shapes (``swap``); without a model tensor to compare
    with it swaps. Only the resolved op has an inverse (the same decision, undone).
    """

    allocates = False

    dim0: int = 0
    dim1: int = 1
    swap: bool | None = field(default=None, kw_only=True)

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "TransposeToFit":
        spec = single_input(self, inputs)
        normalize_dim(self, self.dim0, len(spec.shape))
        normalize_dim(self, self.dim1, len(spec.shape))
        targets = [t for t in ctx.target_specs if t is not None]
        fits = len(targets) == 1 and tuple(targets[0].shape) == tuple(spec.shape)
        return dataclasses.replace(self, swap=not fits)

    def forward_one(self, tensor, stream):
        if self.swap is None:
            raise OpError(f"{self!r} is not resolved: plan it against a model first")
        return tensor.transpose(self.dim0, self.dim1) if self.swap else tensor

    def place_one(self, fragment, spec, stream):
        if not self.swap:
            return fragment
        if not fragment.aligned:
            return None
        a = normalize_dim(self, self.dim0, len(spec.shape))
        b = normalize_dim(self, self.dim1, len(spec.shape))
        return Fragment(fragment.region.swap(a, b), fragment.target, fragment.view.transpose(a, b))

    def inverse(self) -> "TransposeToFit":
        if self.swap is None:
            raise NotInvertibleError(f"{self!r}: whether it transposes is decided against the "
                                     "model's shapes, so only a planned op can be inverted")
        return TransposeToFit(self.dim1, self.dim0, swap=self.swap)
