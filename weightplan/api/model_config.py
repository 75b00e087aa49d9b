"""A saved checkpoint carries its model's config, so ``from_pretrained(out)`` rebuilds it.

Written next to the shards when the model has a transformers config (anything with
``save_pretrained`` and ``to_dict``): ``config.json`` with ``architectures`` and ``dtype``
set the way transformers' ``save_pretrained`` sets them (``dtype``: the shards' own, so a
model loaded in bf16 and written back as its float32 checkpoint says float32), and ``generation_config.json``
when the model has a generation config. Its ``quantization_config`` says what the shards
hold: kept when block FP8 was written (the model's own, else the default 128×128 one),
dropped when the model was dequantized and saved at its own dtype.

The files are made by transformers' own ``save_pretrained`` in a private temporary
directory and handed to the save's commit as bytes (:func:`model_config_files`): they are
renamed into place with the shards, in one journal, never written in place. A
``config.json`` that is a symlink (a Hugging Face cache snapshot links it to a shared
blob) is replaced by the new file, never written through; a failure (a full disk) leaves
the old config and checkpoint as they were.

A checkpoint converted on disk (``explain_convert``) takes its source's ``config.json``
and generation config along, committed with the shards the same way
(:func:`companion_files`, :func:`companion_bytes`), and its mapping defaults to the
``model_type`` that config names.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from weightplan.bridge.config_guard import read_config_bytes, read_config_json
from weightplan.errors import ModelBuildError, SaveError
from weightplan.planner.inputs.quant_config import QuantConfig, parse_quant_config
from weightplan.planner.core.quant.blocks import FP8_DTYPES

CONFIG_FILES = ("config.json", "generation_config.json")


def _dtype_name(model: torch.nn.Module) -> str | None:
    for tensor in model.parameters():
        if tensor.is_floating_point() and tensor.dtype not in FP8_DTYPES:
            return str(tensor.dtype).removeprefix("torch.")
    return None


def _said(config: Any, written: Sequence[str]) -> str | None:
    """The dtype config.json says of shards holding ``written`` (a bf16 checkpoint with
    float32 norms, loaded in float16, says bfloat16: transformers' dtype="auto" builds
    that, as from the checkpoint)."""
    if len(written) > 1:
        own = str(getattr(config, "dtype", None)).removeprefix("torch.")
        return own if own in written else written[0]
    return written[0] if written else None


def _quantization(config: Any, fp8_written: bool) -> dict[str, Any] | None:
    """The ``quantization_config`` that matches the shards (``None``: not quantized)."""
    if not fp8_written:
        return None
    own = parse_quant_config(getattr(config, "quantization_config", None))
    return (own or QuantConfig()).to_dict()


def model_config_files(model: torch.nn.Module, *, fp8_written: bool = False,
                       written_dtypes: Sequence[str] | None = None) -> dict[str, bytes]:
    """The model's ``config.json`` (and generation config) as bytes, ``{name: bytes}``,
    empty for a model without a transformers config. ``fp8_written``: the shards hold
    block FP8 (kept, or ``save(quantize="fp8")``). ``written_dtypes``: the floating
    dtypes the shards hold where a save writes the checkpoint's dtypes back, most bytes
    first (not the model's, which a load in another dtype set on the config and its
    sub-configs): the config says the one, or of several the config's own where it is
    one of them, else the first; ``None``: the model's own dtype.

    Raises:
        SaveError: transformers can't write the config (nothing has been written yet).
    """
    config: Any = getattr(model, "config", None)
    if not callable(getattr(config, "save_pretrained", None)):
        return {}
    config = copy.deepcopy(config)
    config.architectures = [type(model).__name__]
    dtype = _dtype_name(model) if written_dtypes is None else _said(config, written_dtypes)
    if dtype is not None and hasattr(config, "dtype"):
        config.dtype = dtype
    if written_dtypes and dtype is not None:  # (sub-configs a load set say the shards' too)
        for key in getattr(config, "sub_configs", None) or ():
            sub: Any = getattr(config, key, None)
            if getattr(sub, "dtype", None) is not None:
                sub.dtype = dtype
    quantization = _quantization(config, fp8_written)
    if quantization is not None:
        config.quantization_config = quantization
    elif hasattr(config, "quantization_config"):
        del config.quantization_config  # the model was dequantized: plain shards
    generation = getattr(model, "generation_config", None)
    if generation is not None and not callable(getattr(generation, "save_pretrained", None)):
        generation = None
    try:
        with tempfile.TemporaryDirectory(prefix="weightplan-config-") as private:
            config.save_pretrained(private)
            if generation is not None:
                generation.save_pretrained(private)
            return {name: (Path(private) / name).read_bytes() for name in CONFIG_FILES
                    if (Path(private) / name).is_file()}
    except Exception as e:  # transformers raises ValueError / OSError by version
        raise SaveError(f"the model's config can't be written ({type(e).__name__}: {e}); "
                        "nothing was saved") from e


COMPANIONS = ("config.json", "generation_config.json")  # what makes shards a model directory


def source_directory(source: object) -> Path | None:
    """The directory of a checkpoint on disk (a directory, a file, or a list of files)."""
    if isinstance(source, (list, tuple)) and source:
        source = source[0]
    if not isinstance(source, (str, os.PathLike)):
        return None  # an in-memory dict has no directory
    path = Path(source)
    return path if path.is_dir() else path.parent


QUANT_COMPANIONS = ("hf_quant_config.json",)  # ModelOpt's description of its quantized tensors


def companion_files(source: object, *, quantized: bool = False) -> tuple[Path, ...]:
    """The model's ``config.json`` and generation config next to a checkpoint on disk;
    ``quantized``: also ModelOpt's ``hf_quant_config.json`` (a copy that keeps the
    quantized tensors as they are)."""
    directory = source_directory(source)
    if directory is None:
        return ()
    names = COMPANIONS + QUANT_COMPANIONS if quantized else COMPANIONS
    return tuple(directory / name for name in names if (directory / name).is_file())


def config_model_type(source: object) -> tuple[str | None, str | None]:
    """The ``model_type`` the ``config.json`` next to a checkpoint names, and the first class
    its ``architectures`` names (each ``None`` where it names none)."""
    path = next((p for p in companion_files(source) if p.name == "config.json"), None)
    if path is None:
        return None, None
    try:
        config = read_config_json(path)
    except ModelBuildError:
        return None, None  # unreadable: the caller asks for a mapping instead
    value, classes = config.get("model_type"), config.get("architectures")
    first = classes[0] if isinstance(classes, list) and classes else None
    return (value if isinstance(value, str) and value else None,
            first if isinstance(first, str) and first else None)


def check_companions(companions: tuple[Path, ...], directory: str | os.PathLike[str],
                     overwrite: bool) -> None:
    """Refuse, before anything is written, to replace another config in ``directory``."""
    for path in companions:
        target = Path(directory) / path.name
        if (target.exists() and not overwrite and target.resolve() != path.resolve()
                and (not target.is_file() or read_config_bytes(target) != read_config_bytes(path))):
            raise SaveError(f"{target} exists and differs from {path}; pass overwrite=True "
                            "to replace it")


def companion_bytes(companions: tuple[Path, ...]) -> dict[str, bytes]:
    """The companions' bytes, ``{name: bytes}``, read like a config (a regular file of
    bounded size), for the save's commit to rename into place with the shards."""
    try:
        return {path.name: read_config_bytes(path) for path in companions}
    except ModelBuildError as e:
        raise SaveError(f"can't copy the source's config: {e}; nothing was written") from e
