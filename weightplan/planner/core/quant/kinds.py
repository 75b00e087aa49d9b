"""What a dequantize or quantize node carries: its attributes, plan-time inference, its
workspace bytes (for the memory model), its kernel and its inverse.

- :class:`Dequantize` takes ``(q, s)`` → one floating tensor of ``q``'s shape;
- :class:`Quantize` takes one floating tensor → ``(q, s)``.

Each names the other as its inverse (saving a dequantized model back to FP8 runs
:class:`Quantize`; loading an FP8 checkpoint into a floating model runs :class:`Dequantize`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from weightplan.errors import QuantizationError
from weightplan.planner.core.quant.blocks import (
    CHUNK_BYTES, DEQUANTIZE_BYTES, FP8_DTYPES, SCALE_DTYPES, Block, dequantize_into, grid_fits, scale_grid,
    workspace_bytes,
)
from weightplan.planner.core.quant.quantize import FP8, quantize_into, scale_dtype
from weightplan.planner.core.spec import TensorSpec, short_dtype


@dataclass(frozen=True, slots=True)
class Dequantize:
    """``q.float() · s`` per block (ceil grid), cast to ``dtype``."""

    block: Block
    dtype: torch.dtype
    chunk_bytes: int = CHUNK_BYTES

    def infer(self, weight: TensorSpec, scale: TensorSpec, *, key: str = "") -> TensorSpec:
        """The output spec; raises :class:`QuantizationError` naming ``key`` when the
        inputs don't fit (not FP8, no floating destination, scale grid).

        Called once per FP8 weight (46k on DeepSeek-V3): the verdict is cached per shapes
        and dtypes, and equal outputs are one shared spec."""
        try:
            spec = _dequantized(weight.shape, weight.dtype, scale.shape, scale.dtype,
                                self.block, self.dtype)
        except TypeError:  # an unhashable block: check it below
            spec = None
        return spec if spec is not None else self._checked(weight, scale, key)

    def _checked(self, weight: TensorSpec, scale: TensorSpec, key: str) -> TensorSpec:
        if weight.dtype not in FP8_DTYPES:
            raise QuantizationError(f"dequantize needs an FP8 weight, got {weight}", key=key)
        if scale.dtype not in SCALE_DTYPES:
            raise QuantizationError(f"scale is {scale}; a scale is f32/bf16/f16/e8m0", key=key)
        if not self.dtype.is_floating_point or self.dtype in FP8_DTYPES:
            raise QuantizationError(f"dequantize to {short_dtype(self.dtype)}: the destination "
                                    "must be bf16, f16 or f32", key=key)
        if not grid_fits(weight.shape, scale.shape, self.block):
            raise QuantizationError(f"scale {list(scale.shape)} is not the grid "
                                    f"{list(scale_grid(weight.shape, self.block))} of weight "
                                    f"{list(weight.shape)} in blocks {self.block}", key=key)
        return TensorSpec(weight.shape, self.dtype)

    def workspace_bytes(self, weight: TensorSpec) -> int:
        """The fp32 chunk and its table indices the kernel holds while it runs."""
        return workspace_bytes(weight.shape, self.block, self.chunk_bytes, DEQUANTIZE_BYTES)

    def run(self, q: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return dequantize_into(q, s, out, self.block, chunk_bytes=self.chunk_bytes)

    def inverse(self, scale_fmt: str = "float") -> "Quantize":
        return Quantize(self.block, scale_fmt, self.chunk_bytes)

    def __str__(self) -> str:
        return f"dequantize {_block_text(self.block)} → {short_dtype(self.dtype)}"


@dataclass(frozen=True, slots=True)
class Quantize:
    """transformers' ``Fp8Quantize`` per block (partial edge blocks zero-padded)."""

    block: Block = (128, 128)
    scale_fmt: str = "float"
    chunk_bytes: int = CHUNK_BYTES

    def infer(self, weight: TensorSpec, *, key: str = "") -> tuple[TensorSpec, TensorSpec]:
        """``(q spec, scale spec)``; raises :class:`QuantizationError` naming ``key``."""
        if not weight.dtype.is_floating_point or weight.dtype in FP8_DTYPES:
            raise QuantizationError(f"quantize needs a bf16/f16/f32 weight, got {weight}", key=key)
        if len(weight.shape) < 2:
            raise QuantizationError(f"quantize needs a [..., rows, cols] weight, got {weight}",
                                    key=key)
        try:
            sdtype = scale_dtype(self.scale_fmt)
        except ValueError as e:
            raise QuantizationError(str(e), key=key) from e
        return TensorSpec(weight.shape, FP8), TensorSpec(scale_grid(weight.shape, self.block), sdtype)

    def workspace_bytes(self, weight: TensorSpec) -> int:
        return workspace_bytes(weight.shape, self.block, self.chunk_bytes)

    def run(self, w: torch.Tensor, q_out: torch.Tensor, s_out: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_into(w, q_out, s_out, self.block, scale_fmt=self.scale_fmt,
                             chunk_bytes=self.chunk_bytes)

    def inverse(self, dtype: torch.dtype = torch.bfloat16) -> Dequantize:
        return Dequantize(self.block, dtype, self.chunk_bytes)

    def __str__(self) -> str:
        fmt = "" if self.scale_fmt == "float" else f" ({self.scale_fmt} scales)"
        return f"quantize {_block_text(self.block)} → f8_e4m3{fmt}"


@lru_cache(maxsize=4096)
def _dequantized(weight_shape: tuple[int, ...], weight_dtype: torch.dtype,
                 scale_shape: tuple[int, ...], scale_dtype: torch.dtype, block: Block,
                 dtype: torch.dtype) -> TensorSpec | None:
    """:meth:`Dequantize.infer`'s output when the inputs fit, else ``None``."""
    if (weight_dtype not in FP8_DTYPES or scale_dtype not in SCALE_DTYPES
            or not dtype.is_floating_point or dtype in FP8_DTYPES
            or not grid_fits(weight_shape, scale_shape, block)):
        return None
    return TensorSpec(weight_shape, dtype)


def _block_text(block: Block) -> str:
    return "per tensor" if block is None else f"{block[0]}×{block[1]}"
