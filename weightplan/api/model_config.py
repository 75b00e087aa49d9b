"""A saved checkpoint carries its model's config, so ``from_pretrained(out)`` rebuilds it.

Written next to the shards when the model has a transformers config (anything with
``save_pretrained`` and ``to_dict``): ``config.json`` with ``architectures`` and ``dtype``
set the way transformers' ``save_pretrained`` sets them, and ``generation_config.json``
when the model has a generation config. Its ``quantization_config`` says what the shards
hold: kept when block FP8 was written (the model's own, else the default 128×128 one),
dropped when the model was dequantized and saved at its own dtype.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import torch

from weightplan.errors import SaveError
from weightplan.planner.inputs.quant_config import QuantConfig, parse_quant_config
from weightplan.planner.core.quant.blocks import FP8_DTYPES

log = logging.getLogger("weightplan")


def _dtype_name(model: torch.nn.Module) -> str | None:
    for tensor in model.parameters():
        if tensor.is_floating_point() and tensor.dtype not in FP8_DTYPES:
            return str(tensor.dtype).removeprefix("torch.")
    return None


def _quantization(config: Any, fp8_written: bool) -> dict[str, Any] | None:
    """The ``quantization_config`` that matches the shards (``None``: not quantized)."""
    if not fp8_written:
        return None
    own = parse_quant_config(getattr(config, "quantization_config", None))
    return (own or QuantConfig()).to_dict()


def write_model_config(model: torch.nn.Module, directory: str | os.PathLike[str], *,
                       fp8_written: bool = False) -> list[str]:
    """Write the model's ``config.json`` (and generation config); returns the files written.
    ``fp8_written``: the shards hold block FP8 (kept, or ``save(quantize="fp8")``)."""
    config: Any = getattr(model, "config", None)
    if not callable(getattr(config, "save_pretrained", None)):
        return []
    config = copy.deepcopy(config)
    config.architectures = [type(model).__name__]
    dtype = _dtype_name(model)
    if dtype is not None and hasattr(config, "dtype"):
        config.dtype = dtype
    quantization = _quantization(config, fp8_written)
    if quantization is not None:
        config.quantization_config = quantization
    elif hasattr(config, "quantization_config"):
        del config.quantization_config  # the model was dequantized: plain shards
    written = []
    try:
        config.save_pretrained(str(directory))
        written.append("config.json")
        generation = getattr(model, "generation_config", None)
        if generation is not None and callable(getattr(generation, "save_pretrained", None)):
            generation.save_pretrained(str(directory))
            written.append("generation_config.json")
    except Exception as e:  # transformers raises ValueError / OSError by version
        raise SaveError(f"{directory}: the shards are written but the model's config could not "
                        f"be: {type(e).__name__}: {e}") from e
    log.info("wrote %s to %s", ", ".join(written), directory)
    return written
