"""A model built to hold a quantized checkpoint's own format, as serving keeps it.

A checkpoint whose ``config.json`` says it is block FP8 (``quant_method: "fp8"``,
DeepSeek-V3/R1, Qwen3-FP8) is deployed with its FP8 weights and their ``weight_scale_inv``
scales kept: about half the memory of the dequantized bf16 model. :func:`hold_quantized`
swaps the linear layers and experts of a model built on meta for transformers' own
quantized modules, the way ``from_pretrained`` does with the matching quantization config
(transformers' quantizer: its skip list, ``lm_head`` and the model's fp32 modules stay as
they are; the tensor-parallel plans gain the scales' entries). The load plan then keeps the
bytes as they are (no dequantize node).

Formats the model can hold here: block FP8 with float scales. A config naming another
format (or FP8 with ``dequantize: true``, or ``ue8m0`` scales) leaves the model as it is,
and the plan dequantizes into it as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from weightplan.errors import ModelBuildError, QuantizationError
from weightplan.planner.inputs.quant_config import QuantConfig, parse_quant_config


def keepable(config: Any, path: Path) -> QuantConfig | None:
    """The config's quantization when a model can hold it as it is on disk (else ``None``)."""
    raw = getattr(config, "quantization_config", None)
    if raw is None and hasattr(config, "get_text_config"):
        raw = getattr(config.get_text_config(decoder=True), "quantization_config", None)
    return holdable(raw, path)


def holdable(raw: Any, path: Path) -> QuantConfig | None:
    """A ``quantization_config`` (a dict or transformers' object) when a model can hold it
    as it is on disk: block FP8 with float scales, not asked to dequantize (else ``None``)."""
    if raw is None:
        return None
    method = raw.get("quant_method") if isinstance(raw, dict) else getattr(raw, "quant_method",
                                                                            None)
    if str(getattr(method, "value", method)).lower() != "fp8":
        return None  # another format: the planner decides what it can do with it
    try:
        parsed = parse_quant_config(raw, source=str(path))
    except QuantizationError:
        return None  # the plan reports it, naming the field
    if parsed is None or parsed.dequantize or parsed.scale_fmt != "float":
        return None
    return parsed


def hold_quantized(model: nn.Module, config: Any, path: Path) -> str | None:
    """Swap ``model``'s layers for the quantized ones its config's format needs (in place,
    on meta); returns what it holds (``"FP8 128×128"``), ``None`` when it holds nothing
    quantized (the format can't be held: see the module docstring).

    Raises:
        ModelBuildError: transformers can't build the quantized layers (the message says why).
    """
    parsed = keepable(config, path)
    if parsed is None:
        return None
    try:
        from transformers.quantizers import AutoHfQuantizer

        quantizer = AutoHfQuantizer.from_config(config.quantization_config, pre_quantized=True)
        quantizer.preprocess_model(model=model, dtype=None, device_map=None,
                                   checkpoint_files=None, use_kernels=False)
    except Exception as e:  # transformers raises ImportError / ValueError / KeyError by version
        raise ModelBuildError(f"{path}: transformers can't build {type(model).__name__} with "
                              f"its FP8 layers ({type(e).__name__}: {e}); pass dequantize=True "
                              "(--dequantize) to load it dequantized") from e
    model.hf_quantizer = quantizer  # as from_pretrained leaves it (save_pretrained reads it)
    block = "per tensor" if parsed.block is None else "×".join(map(str, parsed.block))
    return f"FP8 {block}"
