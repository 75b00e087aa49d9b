"""Conversion ops (public import path: ``from weightplan.ops import Chunk, ...``)."""

from weightplan.planner.core.ops import (
    BlockDiagonal, BlockDiagonalSplit, Chunk, Collapse, Concatenate, ConversionOp, Conv3dToLinear,
    Expand, Flatten, LinearToConv3d, MergeModulelist, OpContext, Permute, PermuteForRope, Reshape,
    SplitModulelist, TensorwiseOp, Transpose, Unflatten,
)

__all__ = [
    "ConversionOp", "OpContext", "TensorwiseOp", "Chunk", "Concatenate", "MergeModulelist",
    "SplitModulelist", "Transpose", "PermuteForRope", "Conv3dToLinear", "LinearToConv3d",
    "BlockDiagonal", "BlockDiagonalSplit", "Permute", "Flatten", "Unflatten", "Reshape",
    "Collapse", "Expand",
]
