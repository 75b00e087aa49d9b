"""A saved checkpoint carries its model's config, so ``from_pretrained(out)`` rebuilds it.

Written next to the shards when the model has a transformers config (anything with
``save_pretrained`` and ``to_dict``): ``config.json`` with ``architectures`` and ``dtype``
set the way transformers' ``save_pretrained`` sets them, and ``generation_config.json``
when the model has a generation config. Its ``quantization_config`` says what the shards
hold: kept when block FP8 was written (the model's own, else the default 128×128 one),
dropped when the model was dequantized and saved at its own dtype.

A checkpoint converted on disk (``explain_convert``) takes its source's ``config.json``
and generation config along (:func:`copy_companions`), and its mapping defaults to the
``model_type`` that config names.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path
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


COMPANIONS = ("config.json", "generation_config.json")  # what makes shards a model directory


def source_directory(source: object) -> Path | None:
    """The directory of a checkpoint on disk (a directory, a file, or a list of files)."""
    if isinstance(source, (list, tuple)) and source:
        source = source[0]
    if not isinstance(source, (str, os.PathLike)):
        return None  # an in-memory dict has no directory
    path = Path(source)
    return path if path.is_dir() else path.parent


def companion_files(source: object) -> tuple[Path, ...]:
    """The model's ``config.json`` and generation config next to a checkpoint on disk."""
    directory = source_directory(source)
    if directory is None:
        return ()
    return tuple(directory / name for name in COMPANIONS if (directory / name).is_file())


def config_model_type(source: object) -> str | None:
    """The ``model_type`` the ``config.json`` next to a checkpoint names, if any."""
    path = next((p for p in companion_files(source) if p.name == "config.json"), None)
    if path is None:
        return None
    try:
        value = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: the caller asks for a mapping instead
    return value if isinstance(value, str) and value else None


def check_companions(companions: tuple[Path, ...], directory: str | os.PathLike[str],
                     overwrite: bool) -> None:
    """Refuse, before anything is written, to replace another config in ``directory``."""
    for path in companions:
        target = Path(directory) / path.name
        if (target.exists() and not overwrite and target.resolve() != path.resolve()
                and target.read_bytes() != path.read_bytes()):
            raise SaveError(f"{target} exists and differs from {path}; pass overwrite=True "
                            "to replace it")


def copy_companions(companions: tuple[Path, ...], directory: str | os.PathLike[str]
                    ) -> tuple[str, ...]:
    """Copy the config files next to the written shards (each replaced in one rename)."""
    copied = []
    for path in companions:
        target = Path(directory) / path.name
        if target.exists() and target.resolve() == path.resolve():
            continue  # converted in place: it is already there
        partial = target.with_name(f".{path.name}.partial")
        try:
            shutil.copyfile(path, partial)
            os.replace(partial, target)
        except OSError as e:
            partial.unlink(missing_ok=True)
            raise SaveError(f"{directory}: the shards are written but {path.name} could not "
                            f"be copied from {path.parent}: {e}") from e
        copied.append(path.name)
    return tuple(copied)
