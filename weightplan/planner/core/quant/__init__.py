"""Fine-grained FP8: block math (:mod:`.blocks`, :mod:`.quantize`) and what dequantize /
quantize nodes carry (:mod:`.kinds`). The checkpoint side (``quantization_config``, weight
↔ scale pairing) is in :mod:`weightplan.planner.inputs.quant_config` and
:mod:`weightplan.planner.inputs.fp8_pairs`."""

from weightplan.planner.core.quant.blocks import (
    dequantize, dequantize_into, decode_scales, grid_fits, scale_grid, workspace_bytes,
)
from weightplan.planner.core.quant.kinds import Dequantize, Quantize
from weightplan.planner.core.quant.quantize import quantize, quantize_into

__all__ = ["Dequantize", "Quantize", "decode_scales", "dequantize", "dequantize_into",
           "grid_fits", "quantize", "quantize_into", "scale_grid", "workspace_bytes"]
