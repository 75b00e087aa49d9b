"""A saved checkpoint carries its model's config, so ``from_pretrained(out)`` rebuilds it.

Written next to the shards when the model has a transformers config (anything with
``save_pretrained`` and ``to_dict``): ``config.json`` with ``architectures`` and ``dtype``
set the way transformers' ``save_pretrained`` sets them, and ``generation_config.json``
when the model has a generation config.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import torch

from weightplan.errors import SaveError

log = logging.getLogger("weightplan")


def _dtype_name(model: torch.nn.Module) -> str | None:
    for tensor in model.parameters():
        if tensor.is_floating_point():
            return str(tensor.dtype).removeprefix("torch.")
    return None


def write_model_config(model: torch.nn.Module, directory: str | os.PathLike[str]) -> list[str]:
    """Write the model's ``config.json`` (and generation config); returns the files written."""
    config: Any = getattr(model, "config", None)
    if not callable(getattr(config, "save_pretrained", None)):
        return []
    config = copy.deepcopy(config)
    config.architectures = [type(model).__name__]
    dtype = _dtype_name(model)
    if dtype is not None and hasattr(config, "dtype"):
        config.dtype = dtype
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
