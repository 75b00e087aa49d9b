"""Conversion ops carried over to scale grids, for models that keep FP8.

When a model keeps a checkpoint's FP8 weights, each scale must follow its weight through
the converter's op chain: merging experts merges their scales, concatenating
``gate``/``up`` concatenates their grids (transformers' ``FP8Experts`` holds exactly that:
``[E, 2·⌈I/b0⌉, ⌈H/b1⌉]``). An op maps to the same op on the grid when every block stays
whole:

- ``MergeModulelist`` / ``SplitModulelist`` on a leading dim, ``Transpose``: the same op;
- ``Concatenate`` / ``Chunk`` on a block dim: the same op on the grids, only if every
  piece but the last is a whole number of blocks (a block can't straddle two pieces:
  transformers' ``FP8Experts`` allocates ``⌈2I/b0⌉`` scale rows, which is the two halves'
  grids exactly then);
- anything else (``PermuteForRope`` mixes rows of different blocks, user ops, reshapes):
  no scale op; the plan must dequantize instead, and says so.
"""

from __future__ import annotations

import dataclasses

from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.blocks import Block, block_of
from weightplan.planner.core.ops.base import ConversionOp
from weightplan.planner.core.ops.joins import Chunk, Concatenate, MergeModulelist, SplitModulelist
from weightplan.planner.core.ops.reshape import Transpose
from weightplan.planner.core.spec import TensorSpec


def scale_op(op: ConversionOp, weights: tuple[TensorSpec, ...], block: Block, *, key: str = ""
             ) -> ConversionOp:
    """The op that does to the scale grids what ``op`` (resolved) does to ``weights``.

    Raises:
        QuantizationError: the op splits a block or has no meaning on a grid; the message
        names ``key`` and says to load into a floating model (dequantize) instead.
    """
    if isinstance(op, (MergeModulelist, SplitModulelist, Transpose)):
        return op
    ndim = len(weights[0].shape) if weights else 0
    if isinstance(op, (Concatenate, Chunk)):
        return _join(op, weights[0], block, key)
    raise QuantizationError(
        f"{op!r} has no equivalent on FP8 block scales (weights of {ndim} dims), so the FP8 "
        "weights can't be kept; give the model floating parameters to dequantize instead",
        key=key)


def _join(op: Chunk | Concatenate, weight: TensorSpec, block: Block, key: str
          ) -> Chunk | Concatenate:
    ndim = len(weight.shape)
    dim = op.dim + ndim if op.dim < 0 else op.dim
    b = block_of(weight.shape, block)
    per_dim = {ndim - 2: b[0], ndim - 1: b[1]}.get(dim, 1)
    sizes = op.sizes or ()
    if any(size % per_dim for size in sizes[:-1]):
        raise QuantizationError(
            f"{op!r} joins or splits pieces {list(sizes)} on dim {dim}, cutting "
            f"through blocks of {per_dim}; the FP8 weights can't be kept, give the model "
            "floating parameters to dequantize instead", key=key)
    if per_dim == 1:
        return op
    grid = tuple(-(-size // per_dim) for size in sizes)
    return dataclasses.replace(op, dim=dim, sizes=grid)
