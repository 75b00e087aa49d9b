"""Ops the transformers bridge needs beyond weightplan's built-in ones."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from weightplan.errors import NotInvertibleError, OpError
from weightplan.planner.core.geometry import Fragment
from weightplan.planner.core.ops.base import OpContext, Streams, normalize_dim, single_input
from weightplan.planner.core.ops.reshape import Transpose
from weightplan.planner.core.spec import TensorSpec


@dataclass(frozen=True, repr=False)
class TransposeToFit(Transpose):
    """transformers' ``Transpose(check_dims=True)``: swap two dims unless the checkpoint
    tensor already has the model tensor's shape, so both layouts load.

    Decided at plan time from the shapes (``swap``); without a model tensor to compare
    with it swaps. Only the resolved op has an inverse (the same decision, undone).
    """

    swap: bool | None = field(default=None, kw_only=True)

    def resolve(self, ctx: OpContext, inputs: Streams[TensorSpec]) -> "TransposeToFit":
        spec = single_input(self, inputs)
        normalize_dim(self, self.dim0, len(spec.shape))
        normalize_dim(self, self.dim1, len(spec.shape))
        targets = [t for t in ctx.target_specs if t is not None]
        fits = len(targets) == 1 and tuple(targets[0].shape) == tuple(spec.shape)
        return dataclasses.replace(self, swap=not fits)

    def forward_one(self, tensor: torch.Tensor, stream: int) -> torch.Tensor:
        if self.swap is None:
            raise OpError(f"{self!r} is not resolved: plan it against a model first")
        return super().forward_one(tensor, stream) if self.swap else tensor

    def infer_one(self, spec: TensorSpec, stream: int) -> TensorSpec:
        return super().infer_one(spec, stream) if self.swap else spec

    def place_one(self, fragment: Fragment, spec: TensorSpec, stream: int) -> Fragment | None:
        return super().place_one(fragment, spec, stream) if self.swap else fragment

    def inverse(self) -> "TransposeToFit":
        if self.swap is None:
            raise NotInvertibleError(f"{self!r}: whether it transposes is decided against the "
                                     "model's shapes, so only a planned op can be inverted")
        return TransposeToFit(self.dim1, self.dim0, swap=self.swap)
