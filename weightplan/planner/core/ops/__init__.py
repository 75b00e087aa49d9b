"""Conversion ops: each one class carrying inference, placement, kernel and inverse.

The classes are imported from their modules on first use (:func:`__getattr__`): a load
pays only for the ops its mapping names (a plain one: none beyond :mod:`.base`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weightplan.planner.core.ops.base import ConversionOp, OpContext, Streams, TensorwiseOp
    from weightplan.planner.core.ops.blocks import BlockDiagonal, BlockDiagonalSplit
    from weightplan.planner.core.ops.joins import (
        Chunk, Concatenate, MergeModulelist, SplitModulelist,
    )
    from weightplan.planner.core.ops.layout import (
        Collapse, Expand, Flatten, Permute, Reshape, Unflatten,
    )
    from weightplan.planner.core.ops.reshape import (
        Conv3dToLinear, LinearToConv3d, PermuteForRope, Transpose,
    )

# name → the module that defines it
_MODULES = {
    **dict.fromkeys(("ConversionOp", "OpContext", "Streams", "TensorwiseOp"), "base"),
    **dict.fromkeys(("BlockDiagonal", "BlockDiagonalSplit"), "blocks"),
    **dict.fromkeys(("Chunk", "Concatenate", "MergeModulelist", "SplitModulelist"), "joins"),
    **dict.fromkeys(("Collapse", "Expand", "Flatten", "Permute", "Reshape", "Unflatten"),
                    "layout"),
    **dict.fromkeys(("Conv3dToLinear", "LinearToConv3d", "PermuteForRope", "Transpose"),
                    "reshape"),
}

__all__ = [
    "ConversionOp", "OpContext", "Streams", "TensorwiseOp",
    "Chunk", "Concatenate", "MergeModulelist", "SplitModulelist",
    "Transpose", "PermuteForRope", "Conv3dToLinear", "LinearToConv3d",
    "BlockDiagonal", "BlockDiagonalSplit", "Permute", "Flatten", "Unflatten", "Reshape",
    "Collapse", "Expand",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    globals()[name] = value  # once: later lookups don't come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
