"""FP8 on the model side: which parameters are kept in FP8 with a scale parameter.

transformers' ``FP8Linear`` holds ``weight`` (``float8_e4m3fn``) and ``weight_scale_inv``
(fp32, the ceil grid), and ``activation_scale`` with the static scheme; ``FP8Experts``
holds ``gate_up_proj`` / ``down_proj`` with ``gate_up_proj_scale_inv`` /
``down_proj_scale_inv`` (``[E, 2·⌈I/b0⌉, ⌈H/b1⌉]``: the halves' grids stacked). For each
such parameter the plan either reads an FP8 checkpoint's weight and scale straight
(keep) or quantizes a floating checkpoint's weight into both (quantize); a floating
parameter fed by an FP8 weight gets a dequantize node. :func:`decide` names the choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import torch

from weightplan.planner.inputs.fp8_pairs import ACTIVATION_SUFFIXES, scale_key
from weightplan.planner.inputs.model_info import ModelInfo
from weightplan.planner.inputs.quant_config import QuantConfig
from weightplan.planner.core.quant.blocks import FP8_DTYPES, SCALE_DTYPES, Block, grid_fits, scale_grid
from weightplan.planner.core.spec import TensorSpec


class Fp8Action(Enum):
    NONE = "none"  # neither side is FP8
    DEQUANTIZE = "dequantize"  # FP8 checkpoint weight → floating parameter
    KEEP = "keep"  # FP8 checkpoint weight + scale → FP8 parameter + scale parameter
    QUANTIZE = "quantize"  # floating checkpoint weight → FP8 parameter + scale parameter
    REFUSE = "refuse"  # no correct way (an FP8 parameter without a scale parameter, ...)


@dataclass(frozen=True, slots=True)
class Fp8Param:
    """A model parameter held in FP8 with its scale parameter."""

    weight: str
    scale: str
    block: Block
    activation: str | None = None
    scale_dtype: torch.dtype = torch.float32
    exact: bool = False  # written by a lossless re-encode (MXFP4 → FP8), not quantized

    @property
    def companions(self) -> tuple[str, ...]:
        return (self.scale,) + ((self.activation,) if self.activation else ())


@dataclass(frozen=True)
class Fp8Model:
    """Every FP8 parameter of a model, by weight name, and those that can't be loaded."""

    params: Mapping[str, Fp8Param]
    unscaled: tuple[str, ...]  # FP8 parameters with no (fitting) scale parameter
    block: Block

    @property
    def companions(self) -> frozenset[str]:
        return frozenset(k for p in self.params.values() for k in p.companions)


def fp8_params(model: ModelInfo, config: QuantConfig | None = None) -> Fp8Model:
    """Find the FP8 parameters of ``model`` and their scale parameters (block from the
    model's ``quantization_config``, 128×128 by default)."""
    block = config.block if config is not None else (128, 128)
    params: dict[str, Fp8Param] = {}
    unscaled: list[str] = []
    for t in model.unique():
        if t.spec.dtype not in FP8_DTYPES:
            continue
        scale = model.get(scale_key(t.name))
        if scale is None or scale.spec.dtype not in SCALE_DTYPES or not grid_fits(
                t.spec.shape, scale.spec.shape, block):
            unscaled.append(t.name)
            continue
        base = t.name.removesuffix(".weight")
        activation = next((base + s for s in ACTIVATION_SUFFIXES if base + s in model), None)
        params[t.name] = Fp8Param(t.name, scale.name, block, activation, scale.spec.dtype)
    return Fp8Model(params, tuple(unscaled), block)


def decide(source: TensorSpec, target: TensorSpec | None, *, source_scaled: bool,
           target_scaled: bool) -> Fp8Action:
    """What a checkpoint weight of spec ``source`` needs to land in a parameter of spec
    ``target`` (``None``: not in the model), given whether each side has its scale."""
    src_fp8 = source.dtype in FP8_DTYPES
    dst_fp8 = target is not None and target.dtype in FP8_DTYPES
    if not src_fp8 and not dst_fp8:
        return Fp8Action.NONE
    if src_fp8 and not source_scaled:
        # a plain float8 tensor (no scale in the checkpoint) is only a copy into float8
        return Fp8Action.NONE if dst_fp8 and not target_scaled else Fp8Action.REFUSE
    if dst_fp8 and not target_scaled:
        return Fp8Action.REFUSE
    if src_fp8:
        return Fp8Action.KEEP if dst_fp8 else Fp8Action.DEQUANTIZE
    if source.dtype.is_floating_point:
        return Fp8Action.QUANTIZE
    return Fp8Action.REFUSE


def expected_scale(weight: TensorSpec, block: Block, dtype: torch.dtype = torch.float32
                   ) -> TensorSpec:
    """The scale parameter a weight of spec ``weight`` needs."""
    return TensorSpec(scale_grid(weight.shape, block), dtype)
