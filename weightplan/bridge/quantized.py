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
and the plan dequantizes into it as before; asked explicitly to keep it
(``dequantize=False``), that is a :class:`QuantizationError` naming what can be kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from weightplan.errors import ModelBuildError, QuantizationError
from weightplan.planner.inputs.dtype import MODELOPT_CONFIG
from weightplan.planner.inputs.quant_config import QuantConfig, parse_quant_config


def keepable(config: Any, path: Path) -> QuantConfig | None:
    """The config's quantization when a model can hold it as it is on disk (else ``None``)."""
    return holdable(_quantization(config), path)


def _quantization(config: Any) -> Any:
    """transformers' config's ``quantization_config`` (else its text config's), or ``None``."""
    raw = getattr(config, "quantization_config", None)
    if raw is None and hasattr(config, "get_text_config"):
        raw = getattr(config.get_text_config(decoder=True), "quantization_config", None)
    return raw


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


KEPT_TODAY = ("block FP8 with float scales (quant_method 'fp8', DeepSeek-V3's layout); "
              "MXFP4, compressed-tensors, ModelOpt NVFP4 and FP8 with ue8m0 scales load "
              "dequantized")


def hold_quantized(model: nn.Module, config: Any, path: Path, required: bool = False
                   ) -> str | None:
    """Swap ``model``'s layers for the quantized ones its config's format needs (in place,
    on meta); returns what it holds (``"FP8 128×128"``), ``None`` when it holds nothing
    quantized (the format can't be held: see the module docstring).

    Raises:
        ModelBuildError: transformers can't build the quantized layers (the message says why).
        QuantizationError: ``required`` (``dequantize=False``) and the checkpoint is
            quantized in a format no model holds here.
    """
    parsed = keepable(config, path)
    if parsed is None:
        what = _format(config, path)
        if required and what is not None:
            raise QuantizationError(f"{path}: dequantize=False asks to keep the checkpoint's "
                                    f"{what} as stored, but a model holds only {KEPT_TODAY}; "
                                    "leave dequantize unset (or True) to load it dequantized")
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


def _format(config: Any, path: Path) -> str | None:
    """What the checkpoint says it is quantized as (``None``: not quantized)."""
    raw = _quantization(config)
    if raw is None:
        return f"ModelOpt format ({MODELOPT_CONFIG})" if (
            path.parent / MODELOPT_CONFIG).is_file() else None
    words = raw if isinstance(raw, dict) else raw.to_dict() if hasattr(raw, "to_dict") else {}
    method = words.get("quant_method", getattr(raw, "quant_method", "?"))
    method = str(getattr(method, "value", method))
    if method.lower() == "fp8":
        why = ("ue8m0 scales" if words.get("scale_fmt") == "ue8m0" else
               "dequantize: true in its config" if words.get("dequantize") else "its config")
        return f"FP8 ({why})"
    return f"{method} format (quant_method {method!r})"
