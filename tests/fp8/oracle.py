"""transformers' FP8 helpers as model-free oracles, feature-detected (no version pins):
each returns ``None`` when the installed transformers lacks the piece."""

from __future__ import annotations

import inspect
import types

import torch


def _module():
    try:
        import transformers.integrations.finegrained_fp8 as f8
    except ImportError:
        return None
    return f8


def _quantizer(**config):
    from transformers import FineGrainedFP8Config
    params = inspect.signature(FineGrainedFP8Config).parameters
    if any(k not in params for k in config):
        return None
    return types.SimpleNamespace(quantization_config=FineGrainedFP8Config(**config))


def hf_dequantize(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``Fp8Dequantize._dequantize_one`` (block derived from the grid, as transformers does)."""
    f8 = _module()
    if f8 is None or not hasattr(f8, "Fp8Dequantize"):
        return None
    op = f8.Fp8Dequantize(_quantizer())
    try:
        return op._dequantize_one(q, s, output_dtype=dtype)
    except TypeError:  # an older signature without output_dtype
        return op._dequantize_one(q, s).to(dtype)


def hf_quantize(w: torch.Tensor, block=(128, 128), scale_fmt: str = "float"
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``Fp8Quantize._quantize_one`` → ``(q, s)``; ``None`` when transformers lacks it or
    leaves the weight unquantized (not tileable)."""
    f8 = _module()
    config = {"weight_block_size": block}
    if scale_fmt != "float":
        config["scale_fmt"] = scale_fmt
    hq = _quantizer(**config)
    if f8 is None or hq is None or not hasattr(f8, "Fp8Quantize"):
        return None
    out = f8.Fp8Quantize(hq)._quantize_one("m.weight", w)
    if "m.weight_scale_inv" not in out:
        return None
    return out["m.weight"], out["m.weight_scale_inv"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, for bit-exact comparison (NaN == NaN, -0 != +0)."""
    return t.contiguous().view(torch.uint8)
