"""No code from a checkpoint directory ever runs: configs that ask for it are refused.

A ``config.json`` with ``auto_map`` names classes defined in Python files shipped with the
checkpoint (``configuration_*.py``, ``modeling_*.py``); transformers would import them
(after a prompt, or at once with ``trust_remote_code=True``). weightplan refuses such a
config before transformers sees it, and reads every other config with remote code
disabled. The config is read as strict JSON from a regular file (no FIFO, bounded size).
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
    """The config (``read``: as already read from ``path``), unless it asks for code
    shipped with the checkpoint (``auto_map``)."""
    config = read_config_json(path) if read is None else dict(read)
    auto_map = config.get("auto_map")
    if auto_map:
        names = sorted(auto_map) if isinstance(auto_map, dict) else auto_map
        raise ModelBuildError(
            f"{path}: this config's auto_map ({names}) asks to run Python code shipped with "
            "the checkpoint; weightplan never runs code from a checkpoint directory. Build "
            "the model yourself (after reviewing that code) and pass it to explain(), or "
            "pass --model-type to explain the keys without a model")
    return config
