"""Conversion ops (public import path: ``from weightplan.ops import Chunk, ...``)."""

from weightplan.planner.core.ops import (
    Chunk, Concatenate, ConversionOp, Conv3dToLinear, LinearToConv3d, MergeModulelist,
    OpContext, PermuteForRope, SplitModulelist, TensorwiseOp, Transpose,
)

__all__ = [
    "ConversionOp", "OpContext", "TensorwiseOp", "Chunk", "Concatenate", "MergeModulelist",
    "SplitModulelist", "Transpose", "PermuteForRope", "Conv3dToLinear", "LinearToConv3d",
]
