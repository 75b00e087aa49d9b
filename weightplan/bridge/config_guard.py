"""No code from a checkpoint directory ever runs: configs that ask for it are refused.

A ``config.json`` with ``auto_map`` names classes defined in Python files shipped with the
checkpoint (``configuration_*.py``, ``modeling_*.py``); transformers would import them
(after a prompt, or at once with ``trust_remote_code=True``). weightplan refuses a config
whose ``auto_map`` names the config's or a model's class before transformers sees it, and
reads every other config with remote code disabled (``from_pretrained(trust_remote_code=
True)`` then asks for nothing: transformers ignores it on a class it has built in). The
config is read as strict JSON from a regular file (no FIFO, bounded size).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from weightplan.errors import CheckpointError, ModelBuildError
from weightplan.limits import MAX_CONFIG_BYTES
from weightplan.planner.inputs.paths import open_regular
from weightplan.planner.inputs.safetensors_format import strict_json



def read_config_bytes(path: Path) -> bytes:
    """A config file's bytes, if it is a regular file of at most
    :data:`weightplan.limits.MAX_CONFIG_BYTES` (:class:`ModelBuildError` otherwise)."""
    try:
        fd = open_regular(str(path))
        try:
            size = os.fstat(fd).st_size
            if MAX_CONFIG_BYTES.exceeded_by(size):
                raise ModelBuildError(f"{path}: {size} bytes is too large for a model "
                                      f"config; {MAX_CONFIG_BYTES.hint()}")
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    except (CheckpointError, OSError) as e:
        raise ModelBuildError(f"{path}: can't read this config: {e}") from e


def read_config_json(path: Path) -> dict:
    """``config.json`` (or ``generation_config.json``) as a dict; :class:`ModelBuildError`
    if it is not a regular file holding a JSON object of at most
    :data:`weightplan.limits.MAX_CONFIG_BYTES`."""
    raw = read_config_bytes(path)
    try:
        data = strict_json(raw, file=str(path), what="config")
    except CheckpointError as e:
        raise ModelBuildError(f"{path}: can't read this config: {e}") from e
    if not isinstance(data, dict):
        raise ModelBuildError(f"{path}: config.json is not a JSON object")
    return data


def refuse_remote_code(path: Path, read: Mapping[str, object] | None = None) -> dict:
    """The config (``read``: as already read from ``path``), unless its ``auto_map`` names
    code a model load would run (:func:`remote_entries`: the config's or a model's class,
    as transformers imports them under ``trust_remote_code=True``); a tokenizer's or a
    processor's entry is no part of the model and is left alone, as transformers'
    ``AutoModel*`` leaves it.

    Raises:
        ModelBuildError: the ``auto_map`` names the config's or a model's class (the message
            names the entries, says why and what to do).
    """
    config = read_config_json(path) if read is None else dict(read)
    names = remote_entries(config.get("auto_map"))
    if names:
        raise ModelBuildError(
            f"{path}: this config's auto_map ({names}) asks to run Python code shipped with "
            "the checkpoint (transformers imports it under trust_remote_code=True); weightplan "
            "never runs code from a checkpoint directory. To load it, review that code, build "
            "the model yourself (with weightplan.init_empty(): model = Cls(config)) and "
            "weightplan.load(model, path); or pass --model-type to explain the keys without "
            "a model")
    return config


def remote_entries(auto_map: object) -> list[str]:
    """The entries of ``auto_map`` a model load would import: ``AutoConfig`` and the
    ``AutoModel*`` classes (any entry of a value that is not a dict: it can't be told)."""
    if not auto_map:
        return []
    if not isinstance(auto_map, dict):
        return [str(auto_map)]
    return sorted(str(k) for k in auto_map
                  if not isinstance(k, str) or k == "AutoConfig" or k.startswith("AutoModel"))
