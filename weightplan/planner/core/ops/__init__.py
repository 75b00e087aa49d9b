"""Conversion ops: each one class carrying inference, placement, kernel and inverse."""

from weightplan.planner.core.ops.base import ConversionOp, OpContext, Streams, TensorwiseOp
from weightplan.planner.core.ops.blocks import BlockDiagonal, BlockDiagonalSplit
from weightplan.planner.core.ops.joins import Chunk, Concatenate, MergeModulelist, SplitModulelist
from weightplan.planner.core.ops.layout import Flatten, Permute, Unflatten
from weightplan.planner.core.ops.reshape import (
    Conv3dToLinear, LinearToConv3d, PermuteForRope, Transpose,
)

__all__ = [
    "ConversionOp", "OpContext", "Streams", "TensorwiseOp",
    "Chunk", "Concatenate", "MergeModulelist", "SplitModulelist",
    "Transpose", "PermuteForRope", "Conv3dToLinear", "LinearToConv3d",
    "BlockDiagonal", "BlockDiagonalSplit", "Permute", "Flatten", "Unflatten",
]
